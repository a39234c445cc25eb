"""Framework glue the C core calls back into: output allocation for
frameworks without the DLPack C exchange API, current-stream lookup for them
(CuPy, older PyTorch), and the framework's matmul for linear's dequantize
path.  Nothing here is on the hot path of torch tensors through the fused
kernels, which the C core handles through the exchange API."""

from __future__ import annotations

import numpy as np

_KDLCPU = 1


def _module_of(obj) -> str:
    return (type(obj).__module__ or "").split(".", 1)[0]


def numpy_dtype(name: str):
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise TypeError(
                "a bfloat16 result for NumPy inputs needs the ml_dtypes package "
                "(pip install ml_dtypes), or pass out= / out_dtype='float32'") from None
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def allocate(like, device_type: int, device_id: int, shape: tuple, dtype: str):
    """Return an empty array of `shape` and `dtype` in the framework of `like`."""
    mod = _module_of(like)
    if mod == "torch":
        import torch

        dev = "cpu" if device_type == _KDLCPU else f"cuda:{device_id}"
        return torch.empty(shape, dtype=getattr(torch, dtype), device=dev)
    if mod == "cupy":
        import cupy

        if dtype == "bfloat16":
            raise TypeError("CuPy has no bfloat16 dtype; pass out_dtype='float16' or 'float32'")
        with cupy.cuda.Device(device_id):
            return cupy.empty(shape, dtype=dtype)
    if device_type == _KDLCPU:
        return np.empty(shape, dtype=numpy_dtype(dtype))
    raise TypeError(
        f"cannot allocate a CUDA result for {type(like).__module__}.{type(like).__name__} "
        "inputs; pass out= (a torch or CuPy array on the same device)")


def current_stream(arr):
    """The current stream of `arr`'s framework on its device, or None when the
    C core needs no help (CPU arrays, unknown frameworks: the legacy default).
    Called only for producers without the DLPack C exchange API: CuPy, and
    PyTorch releases older than that API."""
    mod = _module_of(arr)
    if mod == "torch":
        if not arr.is_cuda:
            return None
        import torch

        return torch.cuda.current_stream(arr.device).cuda_stream
    if mod != "cupy":
        return None
    import cupy

    dev = getattr(arr.device, "id", None)
    if dev is None:
        return None
    if dev == cupy.cuda.runtime.getDevice():  # the usual case: no switch there and back
        return cupy.cuda.get_current_stream().ptr
    with cupy.cuda.Device(dev):
        return cupy.cuda.get_current_stream().ptr


def _torch_stream_scope(torch, x, stream):
    """The caller's stream (a handle) as torch's current stream, or nothing."""
    import contextlib

    if stream is None or not x.is_cuda:
        return contextlib.nullcontext()
    return torch.cuda.stream(torch.cuda.ExternalStream(stream, device=x.device))


def _cupy_stream_scope(cupy, stream, device):
    import contextlib

    if stream is None:
        return contextlib.nullcontext()
    return cupy.cuda.ExternalStream(stream, device)


def _torch_view(torch, a):
    """a, an array of any framework on x's device (frameworks may be mixed), as a
    torch tensor on the same memory (a read-only NumPy array: on a copy)."""
    if a is None or isinstance(a, torch.Tensor):
        return a
    if _module_of(a) != "numpy":
        return torch.from_dlpack(a)
    if not a.flags.writeable:
        a = a.copy()
    if a.dtype.name == "bfloat16":  # ml_dtypes': neither DLPack nor torch knows it
        return torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def matmul(x, w, bias, y, stream, k0=0, rows=None):
    """y[...] = x @ w + bias in the framework of x (w: [K, N] of x's dtype and
    device, y: [..., N], bias: [N] or None).  The sum is the framework's own;
    for NumPy and CuPy half types it runs in float32 with one rounding.

    With rows, w[:rows] holds rows [k0, k0 + rows) of W (a slab: float32
    torch tensors on the host): y = x[..., k0:k0 + rows] @ w[:rows] + bias for the first slab
    (k0 = 0), y += x[..., k0:k0 + rows] @ w[:rows] for each next one."""
    mod = _module_of(x)
    K, N = x.shape[-1], w.shape[1]
    M = 1
    for d in x.shape[:-1]:
        M *= int(d)
    first = k0 == 0
    if mod == "torch":
        import torch

        x2, y2 = x.reshape(M, K), _torch_view(torch, y).view(M, N)
        bias = _torch_view(torch, bias)
        if rows is not None:
            x2, w = x2[:, k0:k0 + rows], w[:rows]
        with _torch_stream_scope(torch, x, stream):
            if not first:
                y2.addmm_(x2, w)
            elif bias is None:
                torch.mm(x2, w, out=y2)
            else:
                torch.addmm(bias, x2, w, out=y2)
        return None
    if mod == "cupy":
        import cupy

        with _cupy_stream_scope(cupy, stream, x.device.id):
            acc = cupy.matmul(x.reshape(M, K).astype(cupy.float32), w.astype(cupy.float32))
            if bias is not None:
                acc += bias.astype(cupy.float32)
            y.reshape(M, N)[...] = acc.astype(y.dtype)
        return None
    x2, y2, w = np.asarray(x).reshape(M, K), np.asarray(y).reshape(M, N), np.asarray(w)
    if rows is not None:
        x2, w = x2[:, k0:k0 + rows], w[:rows]
    with np.errstate(invalid="ignore", over="ignore"):  # NaN / Inf weights are data here
        if y2.dtype == np.float32:  # no copies: BLAS takes x2's row stride
            if not first:
                y2 += np.matmul(x2, w)
                return None
            np.matmul(x2, w, out=y2)
            if bias is not None:
                y2 += np.asarray(bias)
            return None
        acc = np.matmul(x2.astype(np.float32), w.astype(np.float32))
        if bias is not None:
            acc += np.asarray(bias).astype(np.float32)
        y2[...] = acc.astype(y2.dtype)
    return None


def time_matmul(x, w, bias, y, stream, runs: int = 5) -> float:
    """Microseconds of one matmul() (the median of a few), for the tuner's
    choice between linear's fused kernel and its dequantize path."""
    import time

    mod = _module_of(x)
    samples = []
    if mod == "torch" and x.is_cuda:
        import torch

        with _torch_stream_scope(torch, x, stream):
            matmul(x, w, bias, y, None)  # warm-up (cuBLAS handles, heuristics)
            for _ in range(runs):
                start = torch.cuda.Event(enable_timing=True)
                stop = torch.cuda.Event(enable_timing=True)
                # The GPU spins while the host enqueues the events and the matmul, so
                # the events time the GPU's work, not Python's launch overhead (which
                # the fused kernels' clock does not pay either).
                torch.cuda._sleep(1_000_000)
                start.record()
                matmul(x, w, bias, y, None)
                stop.record()
                stop.synchronize()
                samples.append(start.elapsed_time(stop) * 1000.0)
    elif mod == "cupy":
        import cupy

        with _cupy_stream_scope(cupy, stream, x.device.id):
            matmul(x, w, bias, y, None)
            for _ in range(runs):
                start, stop = cupy.cuda.Event(), cupy.cuda.Event()
                start.record()
                matmul(x, w, bias, y, None)
                stop.record()
                stop.synchronize()
                samples.append(cupy.cuda.get_elapsed_time(start, stop) * 1000.0)
    else:
        matmul(x, w, bias, y, stream)
        for _ in range(runs):
            t0 = time.perf_counter()
            matmul(x, w, bias, y, stream)
            samples.append((time.perf_counter() - t0) * 1e6)
    samples.sort()
    return float(samples[len(samples) // 2])
