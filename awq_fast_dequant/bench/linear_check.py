"""The check of every linear result (DESIGN.md section 7):

    |y - y64| <= 2^-9 (|x| @ |W|) + 1 ulp of y's dtype

against a float64 reference of chosen rows of y (every row up to M = 16; the
first 8 and 8 random ones above), computed once per layer, dtype and M from
the reference weight W and x. A check returns (elements outside the
tolerance, note), like the dequantize benchmark's bit-exactness check, so the
same trial loop runs both; a NaN or an infinity where the reference is finite
is outside (the benchmark's data is finite)."""

from __future__ import annotations

import sys

import numpy as np

from .checks import dtype_kind

FULL_CHECK_MAX_M = 16
CHECK_FIRST = 8
CHECK_RANDOM = 8
TOLERANCE_SCALE = 2.0 ** -9

# (mantissa bits, smallest normal exponent) of each result type: one ulp of v
# is 2^(max(floor(log2|v|), emin) - p).
FORMATS = {"float16": (10, -14), "bfloat16": (7, -126), "float32": (23, -126)}

# Columns of W widened to float64 at a time: bounds the reference's memory on
# the largest layers (28672 x 8192 would be 1.9 GB in float64 at once).
CHUNK_BYTES = 256 << 20


def check_rows(M: int, seed: int) -> np.ndarray:
    """The rows of y that are checked: all up to FULL_CHECK_MAX_M, else the
    first CHECK_FIRST and CHECK_RANDOM others drawn from (seed, M)."""
    if M <= FULL_CHECK_MAX_M:
        return np.arange(M)
    rng = np.random.default_rng([seed, M])
    rest = rng.choice(np.arange(CHECK_FIRST, M), size=min(CHECK_RANDOM, M - CHECK_FIRST),
                      replace=False)
    return np.concatenate([np.arange(CHECK_FIRST), np.sort(rest)])


def ulp(v: np.ndarray, dtype: str) -> np.ndarray:
    """One unit in the last place of each value of v in `dtype` (subnormals
    included: their ulp is the smallest normal's)."""
    p, emin = FORMATS[dtype]
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.abs(v)))
    e = np.where(np.isfinite(e), np.maximum(e, emin), emin)
    return np.exp2(e - p)


def numpy_float64(a: np.ndarray) -> np.ndarray:
    """A float16 / bfloat16 (ml_dtypes or uint16 bits) / float32 array as float64."""
    if a.dtype == np.uint16:  # bfloat16 bits: the top half of a float32
        return (a.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)
    return a.astype(np.float64)


def _chunk(K: int) -> int:
    return max(8, CHUNK_BYTES // (8 * max(K, 1)))


def numpy_reference(x_rows: np.ndarray, W: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(y64, 2^-9 |x| @ |W|) of the rows x_rows [r, K] against W [K, N], in float64."""
    x64 = numpy_float64(x_rows)
    ax = np.abs(x64)
    K, N = W.shape
    y64 = np.empty((x64.shape[0], N))
    bound = np.empty_like(y64)
    step = _chunk(K)
    for c in range(0, N, step):
        w = numpy_float64(W[:, c:c + step])
        y64[:, c:c + step] = x64 @ w
        bound[:, c:c + step] = ax @ np.abs(w)
    return y64, TOLERANCE_SCALE * bound


def torch_reference(torch, x_rows, W) -> tuple[np.ndarray, np.ndarray]:
    """numpy_reference for torch tensors, computed on their device in float64."""
    x64 = x_rows.to(torch.float64)
    ax = x64.abs()
    K, N = W.shape
    y64 = torch.empty((x64.shape[0], N), dtype=torch.float64, device=x64.device)
    bound = torch.empty_like(y64)
    step = _chunk(K)
    for c in range(0, N, step):
        w = W[:, c:c + step].to(torch.float64)
        # Assigned, not matmul(out=): a column slice is not contiguous.
        y64[:, c:c + step] = x64 @ w
        bound[:, c:c + step] = ax @ w.abs()
        del w
    return y64.cpu().numpy(), TOLERANCE_SCALE * bound.cpu().numpy()


def tolerance_check(torch, x, W) -> "ToleranceCheck":
    """The check of a whole result y [M, N] of x [M, K] @ W [K, N] (torch
    tensors on one device; W the dequantized weight), for scripts: called on y,
    it returns (elements outside the tolerance, note)."""
    y64, bound = torch_reference(torch, x, W)
    M, N = x.shape[0], W.shape[1]
    return ToleranceCheck(y64, bound, np.arange(M), M, N)


class ToleranceCheck:
    """Holds y64 and the bound for `rows` of an [M, N] result; called on a
    result, it counts the checked elements outside the tolerance."""

    def __init__(self, y64: np.ndarray, bound: np.ndarray, rows: np.ndarray, M: int, N: int):
        self.y64, self.bound, self.rows = y64, bound, np.asarray(rows)
        self.shape = (M, N)
        self._tol = {}
        self._index = {}

    def tolerance(self, dtype: str) -> np.ndarray:
        if dtype not in self._tol:
            self._tol[dtype] = self.bound + ulp(self.y64, dtype)
        return self._tol[dtype]

    def _rows(self, y) -> np.ndarray:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(y, torch.Tensor):
            index = self._index.get(y.device)
            if index is None:
                index = torch.from_numpy(self.rows.astype(np.int64)).to(y.device)
                self._index[y.device] = index
            return y.index_select(0, index).to(torch.float64).cpu().numpy()
        return numpy_float64(np.asarray(y)[self.rows])

    def __call__(self, y) -> tuple[int, str | None]:
        size = self.y64.size
        kind = dtype_kind(y)
        if kind is None:
            return size, f"result is {type(y).__name__} of dtype {getattr(y, 'dtype', None)}"
        if tuple(y.shape) != self.shape:
            return size, f"shape {tuple(y.shape)} (expected {self.shape})"
        got = self._rows(y)
        tol = self.tolerance(kind)
        err = np.abs(got - self.y64)
        with np.errstate(invalid="ignore"):
            bad = ~(err <= tol)  # NaN is outside
        n = int(np.count_nonzero(bad))
        if n == 0:
            return 0, None
        ratio = np.where(bad, np.nan_to_num(err / tol, nan=np.inf, posinf=np.inf), 0.0)
        r, c = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
        return n, (f"worst at y[{int(self.rows[r])}, {int(c)}]: {float(got[r, c]):.6g} vs "
                   f"{float(self.y64[r, c]):.6g} (|diff| = {float(ratio[r, c]):.3g} x tolerance)")
