"""The linear benchmark's data on the device under test, and the rows it times.

A flavour is one framework's way of doing the work: `NumpyFlavour` (the CPU
device: NumPy arrays; the dense row is numpy.matmul(x_f32, W_f32)) and
`TorchFlavour` (torch tensors on the run's device; the dense row is
torch.matmul(x, W) in x's dtype). Per layer and dtype a flavour builds a
`LinearLayer`: the quantized inputs and the reference weight W, which is also
the dense row's weight (the unquantized layer, allocated once). Per M it
builds a `LinearCase`: x and the output buffers, and the float64 reference
of the rows that are checked.

The reference W is independent of the C core: on the CPU the NumPy reference
(awq_fast_dequant.reference), on torch the formula written in PyTorch that
the dequantize benchmark holds bit-exact against it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .._frameworks import numpy_dtype
from .cases import make_inputs, torch_from_numpy
from .checks import POISON
from .impls import Impl, torch_dequantize
from .linear_check import numpy_float64, numpy_reference, torch_reference
from .shapes import DTYPE_BYTES, Shape

OURS = ("fused", "auto", "dequant+matmul")
DENSE = "dense"
ROWS = OURS + (DENSE,)
PATHS = {"fused": "fused", "auto": "auto", "dequant+matmul": "dequant"}


@dataclass
class LinearLayer:
    K: int
    N: int
    G: int
    dtype: str
    qweight: Any
    qzeros: Any
    scales: Any
    W: Any  # the reference weight [K, N] in dtype
    dense_w: Any  # the dense row's weight


@dataclass
class LinearCase:
    """One timed (layer, dtype, M); what a registered linear row receives."""

    M: int
    K: int
    N: int
    group_size: int
    dtype: str
    device: str
    x: Any
    qweight: Any
    qzeros: Any
    scales: Any
    out: Any  # [M, N] in dtype: the rows of ours write here
    dense_x: Any
    dense_out: Any


def _seed(seed: int, M: int, K: int) -> int:
    """One integer seed per (run seed, M, K): x depends on nothing else."""
    return int(np.random.SeedSequence([seed, M, K]).generate_state(1)[0])


class NumpyFlavour:
    name = "numpy"
    dense_call = "numpy.matmul(x_f32, W_f32, out=): the dense float32 weight"

    def layer(self, shape: Shape, dtype: str, seed: int) -> LinearLayer:
        from .. import reference

        qw, qz, sc = make_inputs(shape.K, shape.N, shape.G, dtype, seed)
        W = reference.dequantize(qw, qz, sc, group_size=shape.G)
        dense = W if dtype == "float32" else numpy_float64(W).astype(np.float32)
        return LinearLayer(shape.K, shape.N, shape.G, dtype, qw, qz, sc, W, dense)

    def case(self, layer: LinearLayer, M: int, seed: int) -> LinearCase:
        rng = np.random.default_rng(_seed(seed, M, layer.K))
        x = rng.standard_normal((M, layer.K), dtype=np.float32)
        dt = numpy_dtype(layer.dtype)
        xd = x.astype(dt)
        return LinearCase(M, layer.K, layer.N, layer.G, layer.dtype, "cpu", xd, layer.qweight,
                          layer.qzeros, layer.scales, np.empty((M, layer.N), dt),
                          numpy_float64(xd).astype(np.float32),
                          np.empty((M, layer.N), np.float32))

    def reference(self, layer: LinearLayer, case: LinearCase, rows: np.ndarray):
        return numpy_reference(np.asarray(case.x)[rows], layer.W)

    @staticmethod
    def poison(buffer):
        return lambda: buffer.fill(POISON)

    @staticmethod
    def dense(layer: LinearLayer, case: LinearCase):
        x, w, y = case.dense_x, layer.dense_w, case.dense_out
        return lambda: np.matmul(x, w, out=y)

    def materializes_w(self, fn, nbytes: int):
        """Not measured for NumPy (the CPU fused kernel has no fallback)."""
        return None


class TorchFlavour:
    name = "torch"
    dense_call = "torch.matmul(x, W, out=): the dense weight in x's dtype"

    def __init__(self, torch, device):
        self.torch = torch
        self.device = torch.device(device)

    def layer(self, shape: Shape, dtype: str, seed: int) -> LinearLayer:
        torch = self.torch
        qw, qz, sc = make_inputs(shape.K, shape.N, shape.G, dtype, seed)
        qw = torch_from_numpy(torch, qw).to(self.device)
        qz = torch_from_numpy(torch, qz).to(self.device)
        sc = torch_from_numpy(torch, sc, dtype).to(self.device)
        W = torch_dequantize(qw, qz, sc, shape.G, getattr(torch, dtype))
        return LinearLayer(shape.K, shape.N, shape.G, dtype, qw, qz, sc, W, W)

    def case(self, layer: LinearLayer, M: int, seed: int) -> LinearCase:
        torch = self.torch
        dt = getattr(torch, layer.dtype)
        gen = torch.Generator(device=self.device)
        gen.manual_seed(_seed(seed, M, layer.K))
        x = torch.randn(M, layer.K, generator=gen, device=self.device).to(dt)
        return LinearCase(M, layer.K, layer.N, layer.G, layer.dtype, str(self.device), x,
                          layer.qweight, layer.qzeros, layer.scales,
                          torch.empty((M, layer.N), dtype=dt, device=self.device), x,
                          torch.empty((M, layer.N), dtype=dt, device=self.device))

    def reference(self, layer: LinearLayer, case: LinearCase, rows: np.ndarray):
        index = self.torch.from_numpy(rows.astype(np.int64)).to(self.device)
        return torch_reference(self.torch, case.x.index_select(0, index), layer.W)

    @staticmethod
    def poison(buffer):
        return lambda: buffer.fill_(POISON)

    def dense(self, layer: LinearLayer, case: LinearCase):
        matmul, x, w, y = self.torch.matmul, case.dense_x, layer.dense_w, case.dense_out
        return lambda: matmul(x, w, out=y)

    def materializes_w(self, fn, nbytes: int):
        """Whether one call of fn allocates a W-sized buffer on the GPU (the
        dequantize path does; a fused kernel never does): the peak of the
        caching allocator around the call. None off CUDA."""
        torch, dev = self.torch, self.device
        if dev.type != "cuda":
            return None
        torch.cuda.synchronize(dev)
        base = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        fn()
        torch.cuda.synchronize(dev)
        return torch.cuda.max_memory_allocated(dev) - base >= nbytes


def w_bytes(layer: LinearLayer) -> int:
    """Bytes of W in the layer's dtype: what the dequantize path allocates."""
    return layer.K * layer.N * DTYPE_BYTES[layer.dtype]


def build_rows(flavour, layer: LinearLayer, case: LinearCase, registered: dict) -> dict[str, Impl]:
    """The timed rows of one case: linear() on each path into case.out, the
    dense matmul into case.dense_out, then the registered rows."""
    from .. import linear

    x, qw, qz, sc, G, out = case.x, case.qweight, case.qzeros, case.scales, case.group_size, case.out
    poison = flavour.poison(out)
    rows = {}
    for name in OURS:
        path = PATHS[name]
        rows[name] = Impl(name, lambda p=path: linear(x, qw, qz, sc, group_size=G, out=out, path=p),
                          True, poison, f"linear(x, qweight, qzeros, scales, out=, path={path!r})")
    rows[DENSE] = Impl(DENSE, flavour.dense(layer, case), False, flavour.poison(case.dense_out),
                       flavour.dense_call)
    for name, (fn, ours) in registered.items():
        rows[name] = Impl(name, lambda fn=fn: fn(case), ours, poison, "registered")
    return rows
