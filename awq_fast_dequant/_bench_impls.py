"""What the benchmark times: its input data, the implementations, and the
bit-exactness check every trial goes through.

An implementation is a zero-argument callable over one `Case` (the inputs of
one layer, already on the device) that returns the dequantized [K, N] matrix.
Ours write into the preallocated ``case.out``; baselines and peers allocate.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from . import reference
from ._bench_report import _version
# Column 8c + j of a packed word sits at bit 4 * REVERSE[j] (DESIGN.md section 1);
# bit-exact means equal bits, or NaN on both sides.
from .reference import _COLUMN_SHIFTS, _float_kind, _ml_bfloat16, _nan_mask

DTYPES = ("float16", "bfloat16", "float32")
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}

# Written into `out` before each trial: |q - z| <= 15 and the benchmark's
# scales are below 2^-4, so no correct output is near this value, and an
# element a kernel forgot to write shows up as a mismatch.
POISON = -12345.0

CUDA_KERNELS = ("v1", "v2", "v3", "v4")
PEERS = ("vllm", "sglang")


# --------------------------------------------------------------------------
# Input data
# --------------------------------------------------------------------------


def make_inputs(K: int, N: int, G: int, dtype: str, seed: int):
    """Random NumPy qweight int32 [K, N/8], qzeros int32 [K/G, N/8], scales [K/G, N].

    Every bit of every word is random (all nibble values, both signs of the
    int32), and scales are positive and log-uniform over 2^-10 .. 2^-4, like
    real AWQ scales: never zeros, which would hide unwritten outputs. bfloat16
    scales are ml_dtypes.bfloat16, or uint16 bit patterns without ml_dtypes
    (the reference reads both). The stream depends on (seed, K, N, G) only.
    """
    rng = np.random.default_rng([seed, K, N, G])
    qweight = rng.integers(0, 2**32, size=(K, N // 8), dtype=np.uint32).view(np.int32)
    qzeros = rng.integers(0, 2**32, size=(K // G, N // 8), dtype=np.uint32).view(np.int32)
    wide = np.exp2(rng.uniform(-10.0, -4.0, size=(K // G, N))).astype(np.float32)
    if dtype == "float32":
        scales = wide
    elif dtype == "float16":
        scales = wide.astype(np.float16)
    else:
        # bfloat16 is the top half of a float32; truncation is as good as any
        # rounding for random data.
        bits = (wide.view(np.uint32) >> np.uint32(16)).astype(np.uint16)
        bf16 = _ml_bfloat16()
        scales = bits if bf16 is None else bits.view(bf16)
    return qweight, qzeros, scales


def torch_from_numpy(torch, arr: np.ndarray, dtype: str | None = None):
    """A torch CPU tensor sharing arr's memory; bfloat16 (ml_dtypes or uint16 bits) kept as bfloat16."""
    if dtype == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(arr).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(arr))


@dataclass
class Case:
    """The inputs of one timed layer, on the benchmark's device.

    qweight, qzeros, scales and out are NumPy arrays on the CPU device and
    torch tensors on CUDA. `out` is the preallocated [K, N] destination of
    the implementations that take one. `extra` holds lazily built views
    (torch views of NumPy inputs for the torch baseline on the CPU).
    """

    K: int
    N: int
    group_size: int
    dtype: str
    device: str
    qweight: Any
    qzeros: Any
    scales: Any
    out: Any
    extra: dict = field(default_factory=dict)

    def torch_inputs(self):
        """(qweight, qzeros, scales) as torch tensors on the case's device."""
        if "torch" not in self.extra:
            import torch

            if isinstance(self.qweight, torch.Tensor):
                self.extra["torch"] = (self.qweight, self.qzeros, self.scales)
            else:
                self.extra["torch"] = (
                    torch_from_numpy(torch, self.qweight),
                    torch_from_numpy(torch, self.qzeros),
                    torch_from_numpy(torch, self.scales, self.dtype),
                )
        return self.extra["torch"]


def cuda_case(torch, device, K: int, N: int, G: int, dtype: str, inputs) -> Case:
    """A Case on a CUDA device from make_inputs' NumPy arrays, `out` allocated."""
    qw, qz, sc = inputs
    return Case(
        K=K, N=N, group_size=G, dtype=dtype, device=str(device),
        qweight=torch_from_numpy(torch, qw).to(device),
        qzeros=torch_from_numpy(torch, qz).to(device),
        scales=torch_from_numpy(torch, sc, dtype).to(device),
        out=torch.empty((K, N), dtype=getattr(torch, dtype), device=device),
    )


@dataclass
class Impl:
    """One timed implementation: `fn()` returns the [K, N] result of the case."""

    name: str
    fn: Callable[[], Any]
    ours: bool
    poison: Callable[[], None] | None = None  # fills the shared `out` before a trial
    note: str = ""


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

        return vllm_op, {"status": "available", "version": _version("vllm"),
                         "op": "vllm._custom_ops.awq_dequantize"}
    if name == "sglang":
        op, failed = _peer_op("sgl_kernel")
        if failed:
            return None, failed
        return op, {"status": "available", "version": _version("sgl-kernel"),
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
    if not name or "," in name:
        raise ValueError(f"implementation name must be non-empty without commas; got {name!r}")
    _REGISTERED[name] = (fn, ours)


def unregister_impl(name: str) -> None:
    """Remove an implementation added by register_impl (no error if absent)."""
    _REGISTERED.pop(name, None)


def off_by_one_ulp(case: Case):
    """A deliberately wrong implementation: correct, then one bit of the
    last element flipped (one unit in the last place). The test hook of
    AWQ_FAST_DEQUANT_BENCH_INJECT."""
    from . import dequantize

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


def registered_impls(environ) -> dict[str, tuple[Callable[[Case], Any], bool]]:
    """register_impl's entries plus the wrong ones named by the environment."""
    found = dict(_REGISTERED)
    for name in (environ.get(INJECT_ENV) or "").split(","):
        name = name.strip()
        if name:
            found[name] = (off_by_one_ulp, True)
    return found


# --------------------------------------------------------------------------
# Bit-exactness checks: (mismatching elements, note)
# --------------------------------------------------------------------------


def _dtype_kind(x) -> str | None:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        name = str(x.dtype).removeprefix("torch.")
        return name if name in DTYPES else None
    return _float_kind(x) if isinstance(getattr(x, "dtype", None), np.dtype) else None


class NumpyCheck:
    """Compares results on the CPU (NumPy arrays, torch CPU tensors) with the reference."""

    def __init__(self, ref: np.ndarray, dtype: str):
        self.dtype = dtype
        self.bits = reference.to_bits(ref)
        self._nan = None

    def __call__(self, actual) -> tuple[int, str | None]:
        size = self.bits.size
        kind = _dtype_kind(actual)
        if kind != self.dtype:
            return size, f"dtype {getattr(actual, 'dtype', type(actual).__name__)} (expected {self.dtype})"
        if tuple(actual.shape) != self.bits.shape:
            return size, f"shape {tuple(actual.shape)} (expected {self.bits.shape})"
        bits = reference.to_bits(actual)
        if np.array_equal(bits, self.bits):
            return 0, None
        if self._nan is None:
            self._nan = _nan_mask(self.bits, self.dtype)
        differ = (bits != self.bits) & ~(_nan_mask(bits, self.dtype) & self._nan)
        return int(np.count_nonzero(differ)), None


class TorchCheck:
    """Compares torch results with the reference, on the results' device.

    The reference's bits are copied to the device once; a correct result is
    then one torch.equal over int16 (int32 for float32) views.
    """

    def __init__(self, torch, ref: np.ndarray, dtype: str, device):
        self.torch = torch
        self.dtype = dtype
        self.torch_dtype = getattr(torch, dtype)
        view = np.int32 if dtype == "float32" else np.int16
        self.bits = torch.from_numpy(np.ascontiguousarray(ref).view(view)).to(device)
        self._nan = None

    def __call__(self, actual) -> tuple[int, str | None]:
        torch = self.torch
        size = self.bits.numel()
        if not isinstance(actual, torch.Tensor):
            return size, f"result is a {type(actual).__name__}, not a torch tensor"
        if actual.dtype != self.torch_dtype:
            return size, f"dtype {actual.dtype} (expected {self.torch_dtype})"
        if tuple(actual.shape) != tuple(self.bits.shape):
            return size, f"shape {tuple(actual.shape)} (expected {tuple(self.bits.shape)})"
        if actual.device != self.bits.device:
            actual = actual.to(self.bits.device)
        bits = actual.contiguous().view(self.bits.dtype)
        if torch.equal(bits, self.bits):
            return 0, None
        if self._nan is None:
            self._nan = _nan_mask(self.bits, self.dtype)
        differ = (bits != self.bits) & ~(_nan_mask(bits, self.dtype) & self._nan)
        return int(differ.sum().item()), None
