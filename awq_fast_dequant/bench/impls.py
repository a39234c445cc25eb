"""What the benchmark times: our implementations, the baselines (the formula
as a user would write it), the peers (vLLM, SGLang) and implementations
registered by tests.

An implementation is a zero-argument callable over one `Case` that returns
the dequantized [K, N] matrix. Ours write into the preallocated
``case.out``; baselines and peers allocate.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .._frameworks import numpy_dtype
# Column 8c + j of a packed word sits at bit 4 * REVERSE[j] (DESIGN.md section 1).
from ..reference import _COLUMN_SHIFTS
from .cases import Case
from .env import dist_version

CUDA_KERNELS = ("v1", "v2", "v3", "v4")
PEERS = ("vllm", "sglang")
BASELINES = ("torch", "numpy")


@dataclass
class Impl:
    """One timed implementation: `fn()` returns the [K, N] result of the case."""

    name: str
    fn: Callable[[], Any]
    ours: bool
    poison: Callable[[], None] | None = None  # fills the shared `out` before a trial
    note: str = ""


def role(name: str, registered: dict) -> str:
    """How the report names an implementation: ours, baseline, peer or registered."""
    if name in registered:
        return "registered"
    if name in PEERS:
        return "peer"
    if name in BASELINES:
        return "baseline"
    return "ours"


# --------------------------------------------------------------------------
# Baselines: the formula as a user would write it
# --------------------------------------------------------------------------

_TORCH_SHIFTS: dict = {}


def torch_dequantize(qweight, qzeros, scales, group_size: int, out_dtype):
    """AWQ dequantization in plain PyTorch, any device.

    Unpack with one shift per column of each run of 8, form q - z as an
    integer, multiply in float32, round once to the output type: the formula
    of DESIGN.md section 1, so the result is bit-exact. The shift table is
    built once per device, as a module constant would be (building it per
    call from a Python list would add a host-to-device copy that waits on
    the GPU).
    """
    import torch

    shifts = _TORCH_SHIFTS.get(qweight.device)
    if shifts is None:
        shifts = torch.tensor(_COLUMN_SHIFTS.tolist(), dtype=torch.int32, device=qweight.device)
        _TORCH_SHIFTS[qweight.device] = shifts
    K, N = qweight.shape[0], 8 * qweight.shape[1]
    q = ((qweight.unsqueeze(-1) >> shifts) & 0xF).reshape(K, N)
    z = ((qzeros.unsqueeze(-1) >> shifts) & 0xF).reshape(-1, N)
    z = z.repeat_interleave(group_size, dim=0)
    s = scales.float().repeat_interleave(group_size, dim=0)
    return ((q - z).float() * s).to(out_dtype)


def numpy_dequantize(qweight, qzeros, scales, group_size: int, out_dtype):
    """AWQ dequantization in vectorised NumPy (bfloat16 through ml_dtypes)."""
    shifts = _COLUMN_SHIFTS
    words = np.ascontiguousarray(qweight).view(np.uint32)
    zero_words = np.ascontiguousarray(qzeros).view(np.uint32)
    K, N = words.shape[0], 8 * words.shape[1]
    q = ((words[:, :, None] >> shifts) & np.uint32(0xF)).reshape(K, N).astype(np.int32)
    z = ((zero_words[:, :, None] >> shifts) & np.uint32(0xF)).reshape(-1, N).astype(np.int32)
    z = np.repeat(z, group_size, axis=0)
    s = np.repeat(scales.astype(np.float32), group_size, axis=0)
    with np.errstate(over="ignore", invalid="ignore"):
        return ((q - z).astype(np.float32) * s).astype(out_dtype)


# --------------------------------------------------------------------------
# Peers (optional): vLLM and SGLang dequant ops
# --------------------------------------------------------------------------


def _peer_op(module: str):
    """(module.awq_dequantize, None), or (None, status) when it cannot be had."""
    top = module.split(".")[0]
    try:
        mod = importlib.import_module(module)
    except BaseException as exc:  # a peer's import can fail in many ways
        if isinstance(exc, KeyboardInterrupt):
            raise
        if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] == top:
            return None, {"status": "skipped (not installed)"}
        return None, {"status": f"skipped (import failed: {type(exc).__name__}: {exc})"}
    op = getattr(mod, "awq_dequantize", None)
    if op is None:
        return None, {"status": f"skipped ({module} has no awq_dequantize)"}
    return op, None


def load_peer(name: str):
    """(op or None, status dict) for 'vllm' or 'sglang'.

    The op takes (qweight, scales, qzeros) -- note the order -- and returns
    a new [K, N] tensor in the scales' dtype.
    """
    if name == "vllm":
        raw, failed = _peer_op("vllm._custom_ops")
        if failed:
            return None, failed
        form = {}

        def vllm_op(qweight, scales, qzeros):
            # vLLM's signature is (qweight, scales, zeros, split_k_iters, thx, thy);
            # 0s pick its defaults. Fall back to three arguments if that changes.
            if form.get("short"):
                return raw(qweight, scales, qzeros)
            try:
                return raw(qweight, scales, qzeros, 0, 0, 0)
            except TypeError:
                form["short"] = True
                return raw(qweight, scales, qzeros)

        return vllm_op, {"status": "available", "version": dist_version("vllm"),
                         "op": "vllm._custom_ops.awq_dequantize"}
    if name == "sglang":
        op, failed = _peer_op("sgl_kernel")
        if failed:
            return None, failed
        return op, {"status": "available", "version": dist_version("sgl-kernel"),
                    "op": "sgl_kernel.awq_dequantize"}
    raise ValueError(f"unknown peer {name!r}")


# --------------------------------------------------------------------------
# Registered (test) implementations
# --------------------------------------------------------------------------

# name -> (fn(case) -> result, ours)
_REGISTERED: dict[str, tuple[Callable[[Case], Any], bool]] = {}

INJECT_ENV = "AWQ_FAST_DEQUANT_BENCH_INJECT"


def register_impl(name: str, fn: Callable[[Case], Any], *, ours: bool = True) -> None:
    """Add an implementation to every later benchmark run of this process.

    fn(case) returns the [K, N] result for a `Case` (case.qweight, .qzeros,
    .scales, .group_size, .dtype, .out: NumPy arrays on the CPU device,
    torch tensors on CUDA). With ours=True (the default) it is held to the
    bit-exactness contract: one wrong bit makes the run exit non-zero.
    """
    if not isinstance(name, str) or not name or "," in name:
        raise ValueError(f"register_impl: name must be a non-empty string without commas; "
                         f"got {name!r}")
    if not callable(fn):
        raise TypeError(f"register_impl: fn must be callable as fn(case); got {type(fn).__name__}")
    _REGISTERED[name] = (fn, ours)


def unregister_impl(name: str) -> None:
    """Remove an implementation added by register_impl (no error if absent)."""
    _REGISTERED.pop(name, None)


def off_by_one_ulp(case: Case):
    """A deliberately wrong implementation: correct, then one bit of the
    last element flipped (one unit in the last place). The test hook of
    AWQ_FAST_DEQUANT_BENCH_INJECT."""
    from .. import dequantize

    kernel = "cpu" if case.device == "cpu" else "auto"
    out = dequantize(case.qweight, case.qzeros, case.scales, group_size=case.group_size,
                     out=case.out, kernel=kernel)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(out, torch.Tensor):
        bits = out.view(torch.int32 if case.dtype == "float32" else torch.int16).view(-1)
        bits[-1:] ^= 1
    else:
        bits = out.view(np.uint32 if case.dtype == "float32" else np.uint16).reshape(-1)
        bits[-1] ^= 1
    return out


def _injected(environ) -> list[str]:
    return [n.strip() for n in (environ.get(INJECT_ENV) or "").split(",") if n.strip()]


def registered_impls(environ) -> dict[str, tuple[Callable[[Case], Any], bool]]:
    """register_impl's entries plus the wrong ones named by the environment."""
    found = dict(_REGISTERED)
    for name in _injected(environ):
        found[name] = (off_by_one_ulp, True)
    return found


# name -> (fn(linear case) -> y, ours): the rows --linear adds to its own.
_REGISTERED_LINEAR: dict[str, tuple[Callable[[Any], Any], bool]] = {}


def register_linear_impl(name: str, fn: Callable[[Any], Any], *, ours: bool = True) -> None:
    """Add a row to every later --linear run of this process.

    fn(case) returns y [M, N] for a linear case (case.x, .qweight, .qzeros,
    .scales, .group_size, .dtype, .M, .out: the [M, N] buffer it may write;
    NumPy arrays on the CPU device, torch tensors on CUDA). With ours=True
    it is held to the tolerance of DESIGN.md section 7: one element outside
    makes the run exit non-zero.
    """
    if not isinstance(name, str) or not name or "," in name:
        raise ValueError(f"register_linear_impl: name must be a non-empty string without "
                         f"commas; got {name!r}")
    if not callable(fn):
        raise TypeError(f"register_linear_impl: fn must be callable as fn(case); "
                        f"got {type(fn).__name__}")
    _REGISTERED_LINEAR[name] = (fn, ours)


def unregister_linear_impl(name: str) -> None:
    """Remove a row added by register_linear_impl (no error if absent)."""
    _REGISTERED_LINEAR.pop(name, None)


def swapped_columns(case):
    """A deliberately wrong linear: the fused result with output columns 0 and
    1 exchanged, as a nibble-order mistake would leave them. The --linear
    test hook of AWQ_FAST_DEQUANT_BENCH_INJECT."""
    from .. import linear

    y = linear(case.x, case.qweight, case.qzeros, case.scales, group_size=case.group_size,
               out=case.out, path="fused")
    first = y[:, 0].copy() if isinstance(y, np.ndarray) else y[:, 0].clone()
    y[:, 0] = y[:, 1]
    y[:, 1] = first
    return y


def registered_linear_impls(environ) -> dict[str, tuple[Callable[[Any], Any], bool]]:
    """register_linear_impl's entries plus the wrong ones named by the environment."""
    found = dict(_REGISTERED_LINEAR)
    for name in _injected(environ):
        found[name] = (swapped_columns, True)
    return found


# --------------------------------------------------------------------------
# The implementations of one layer
# --------------------------------------------------------------------------


def build_impls(case: Case, names, *, poison, peers: dict, registered: dict) -> dict[str, Impl]:
    """Impl for each name over `case`. `poison` fills case.out before a trial;
    peers maps a loaded peer's name to (op, status)."""
    from .. import dequantize, smart_dequantize

    qw, qz, sc, out, G = case.qweight, case.qzeros, case.scales, case.out, case.group_size
    impls = {}
    for name in names:
        if name in CUDA_KERNELS or name == "cpu":
            fn = (lambda k=name: dequantize(qw, qz, sc, group_size=G, out=out, kernel=k))
            impls[name] = Impl(name, fn, True, poison, f"dequantize(kernel={name!r}, out=)")
        elif name == "smart":
            impls[name] = Impl(name, lambda: smart_dequantize(qw, qz, sc, group_size=G, out=out),
                               True, poison, "smart_dequantize(out=)")
        elif name == "torch":
            import torch

            t_in = case.torch_inputs()
            t_dt = getattr(torch, case.dtype)
            impls[name] = Impl(name, lambda a=t_in, d=t_dt: torch_dequantize(*a, G, d), True,
                               None, "plain PyTorch formula (allocates)")
        elif name == "numpy":
            n_dt = numpy_dtype(case.dtype)
            impls[name] = Impl(name, lambda d=n_dt: numpy_dequantize(qw, qz, sc, G, d), True,
                               None, "vectorised NumPy formula (allocates)")
        elif name in peers:
            op, status = peers[name]
            impls[name] = Impl(name, lambda op=op: op(qw, sc, qz), False, None,
                               status.get("op", name))
        elif name in registered:
            fn, ours = registered[name]
            impls[name] = Impl(name, lambda fn=fn: fn(case), ours, poison, "registered")
    return impls
