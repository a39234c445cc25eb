"""The benchmark's input data: random AWQ layers, and a `Case` holding one
layer's inputs and output buffer on the device under test."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._frameworks import numpy_dtype
from ..reference import _ml_bfloat16


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


def cpu_case(K: int, N: int, G: int, dtype: str, inputs) -> Case:
    """A Case on the CPU over make_inputs' NumPy arrays, `out` allocated."""
    qw, qz, sc = inputs
    out = np.empty((K, N), dtype=numpy_dtype(dtype))
    return Case(K=K, N=N, group_size=G, dtype=dtype, device="cpu",
                qweight=qw, qzeros=qz, scales=sc, out=out)
