"""The bit-exactness check every trial goes through: a result against the
NumPy reference, equal bits or NaN on both sides (DESIGN.md section 1).
A check returns (mismatching elements, note)."""

from __future__ import annotations

import sys

import numpy as np

from .. import reference
from ..reference import _float_kind, _nan_mask
from .shapes import DTYPES

# Written into `out` before each trial: |q - z| <= 15 and the benchmark's
# scales are below 2^-4, so no correct output is near this value, and an
# element a kernel forgot to write shows up as a mismatch.
POISON = -12345.0


def dtype_kind(x) -> str | None:
    """float16 / bfloat16 / float32 for a result array (NumPy or torch), else None."""
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
        kind = dtype_kind(actual)
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
