"""Framework glue the C core calls back into: output allocation for
frameworks without the DLPack C exchange API, and current-stream lookup
for them (CuPy, older PyTorch).  Nothing here is on the hot path of torch tensors, which the C
core handles through the exchange API."""

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
