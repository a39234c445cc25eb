"""Quantize dense weights to the AWQ "GEMM" layout; pack and unpack 4-bit values.

The packing (which nibble holds which column, ``ORDER`` / ``REVERSE``) is defined
once, in :mod:`awq_fast_dequant.reference`; this module only applies it.

Everything here is NumPy, vectorised and deterministic. NumPy arrays (and nested
lists) in give NumPy arrays out; torch tensors in (any device) give torch CPU tensors
out. torch is never imported by this module: a tensor can only exist if the caller
imported it. What cannot be read as numbers on the host (a meta or sparse tensor, a
type NumPy lacks, an array in non-native byte order) raises TypeError naming the
argument, before any work.
"""

from __future__ import annotations

import operator
import sys

import numpy as np

from .reference import DTYPES, REVERSE, _round_to, _to_float32

__all__ = ["pack", "unpack", "quantize"]

# Bit offset of column j (of each run of 8 columns) inside its packed word.
_COLUMN_SHIFTS = tuple(np.uint32(4 * nibble) for nibble in REVERSE)

# Rows are processed in blocks of about this many elements, which bounds the
# float32 temporaries of quantize() to a few tens of MB.
_BLOCK_ELEMS = 1 << 21

_FLOAT_NAMES = DTYPES + ("float64",)
_INTEGER_NAMES = tuple(f"{sign}int{bits}" for sign in ("", "u") for bits in (8, 16, 32, 64))

# Conversions to NumPy can fail in these ways (ragged lists, arrays on a GPU, dtypes
# NumPy lacks); MemoryError and KeyboardInterrupt are not among them and pass through.
_READ_ERRORS = (TypeError, ValueError, RuntimeError, BufferError, NotImplementedError,
                AttributeError)


def _torch_of(x):
    """The torch module if x is a torch tensor, else None."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return torch
    return None


def _tensor_to_numpy(t, torch, name: str, expected: str) -> np.ndarray:
    """A NumPy copy of the values of a torch tensor on any device."""
    if t.device.type == "meta":
        raise TypeError(
            f"{name} is a meta tensor: it has a shape and a dtype but no values to read; "
            f"pass a tensor that holds data"
        )
    if t.layout != torch.strided or t.is_nested:
        raise TypeError(
            f"{name} must be a dense (strided) tensor; got layout {t.layout}"
            f"{' (nested)' if t.is_nested else ''}; pass {name}.to_dense()"
        )
    # resolve_*: torch refuses .numpy() on lazily negated or conjugated views.
    t = t.detach().cpu().resolve_conj().resolve_neg()
    if t.dtype == torch.bfloat16:
        t = t.float()  # NumPy has no bfloat16; the widening is exact
    try:
        return t.numpy()
    except _READ_ERRORS as e:  # older torch converts no uint16..uint64
        raise TypeError(f"{name} must be {expected}; torch {torch.__version__} cannot hand "
                        f"{t.dtype} to NumPy") from e


def _numpy_array(x, name: str, expected: str) -> np.ndarray:
    """np.asarray(x) for what is not a torch tensor, refused by name when NumPy cannot
    read it as numbers or holds it in non-native byte order."""
    try:
        arr = np.asarray(x)
    except _READ_ERRORS as e:
        raise TypeError(
            f"{name} must be a NumPy array, a torch tensor or nested lists of numbers "
            f"({expected}); could not read {type(x).__name__}: {e}"
        ) from e
    if not arr.dtype.isnative:
        raise TypeError(
            f"{name} has non-native byte order; convert it with "
            f"arr.astype(arr.dtype.newbyteorder('='))"
        )
    if arr.dtype.hasobject:  # np.asarray of an object it cannot read as numbers
        raise TypeError(
            f"{name} must be {expected}; got {type(x).__name__}, which NumPy reads only as "
            f"Python objects"
        )
    return arr


def _matrix(x, name: str, expected: str, dtype_names):
    """(x as a 2-D NumPy array, its dtype's name as given, torch module or None).

    The dtype must be one of dtype_names. Anything that cannot be read as numbers on
    the host raises TypeError naming `name`, as does an array in non-native byte
    order: the package's C core refuses those too, and one rule for every function
    beats a silent byte swap in some."""
    torch = _torch_of(x)
    if torch is not None:
        dtype_name = str(x.dtype).removeprefix("torch.")
    else:
        arr = _numpy_array(x, name, expected)
        dtype_name = arr.dtype.name
    # before a tensor's conversion: float8, qint8 and others have no NumPy type
    if dtype_name not in dtype_names:
        raise TypeError(f"{name} must be {expected}; got {dtype_name}")
    if torch is not None:
        arr = _tensor_to_numpy(x, torch, name, expected)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be 2-D; got shape {arr.shape}")
    return arr, dtype_name, torch


def _pack_nibbles(values: np.ndarray) -> np.ndarray:
    """Integer [K, N] with values in 0..15 -> int32 [K, N/8]; no checks."""
    K, N = values.shape
    words = np.zeros((K, N // 8), dtype=np.uint32)
    for j, shift in enumerate(_COLUMN_SHIFTS):
        words |= values[:, j::8].astype(np.uint32) << shift
    return words.view(np.int32)


def pack(intweights):
    """Pack 4-bit values [K, N] (integers 0..15, N a multiple of 8) into int32 [K, N/8].

    Column n of the input lands in word n // 8, at the nibble the AWQ layout gives it
    (see awq_fast_dequant.reference). unpack() is the inverse.
    """
    values, _, torch = _matrix(intweights, "intweights", "an integer array", _INTEGER_NAMES)
    K, N = values.shape
    if N % 8:
        raise ValueError(f"intweights must have a multiple of 8 columns; got shape {values.shape}")
    if values.size:
        outside = (values < 0) | (values > 15)
        if outside.any():
            index = np.unravel_index(int(np.argmax(outside)), values.shape)
            raise ValueError(
                f"intweights must hold values in 0..15; got {values[index]} at index "
                f"{tuple(int(i) for i in index)}"
            )
    words = _pack_nibbles(values)
    return torch.from_numpy(words) if torch is not None else words


def unpack(qweight):
    """Unpack int32/uint32 [K, N/8] AWQ words into their 4-bit values, uint8 [K, N]."""
    arr, _, torch = _matrix(qweight, "qweight", "int32 or uint32", ("int32", "uint32"))
    words = np.ascontiguousarray(arr).view(np.uint32)
    K, W = words.shape
    values = np.empty((K, 8 * W), dtype=np.uint8)
    for j, shift in enumerate(_COLUMN_SHIFTS):
        values[:, j::8] = (words >> shift) & np.uint32(0xF)
    return torch.from_numpy(values) if torch is not None else values


def _weight_matrix(weight):
    """(NumPy 2-D float array, scales type name, torch module or None)."""
    arr, name, torch = _matrix(weight, "weight", "float16, bfloat16, float32 or float64",
                               _FLOAT_NAMES)
    if arr.shape[1] % 8:
        raise ValueError(
            f"weight must have a multiple of 8 columns (N = out_features); got shape {arr.shape}"
        )
    scale_kind = "float16" if name == "float64" else name
    return arr, scale_kind, torch


def _check_group_size(group_size, K: int) -> int:
    if group_size is None:
        return max(K, 1)  # per channel: one group spans every row
    # bool has __index__ but is never a group size (the C core refuses it too)
    if isinstance(group_size, bool) or not hasattr(type(group_size), "__index__"):
        raise TypeError(
            f"group_size must be an int (or -1/None for per-channel); "
            f"got {type(group_size).__name__}"
        )
    G = operator.index(group_size)
    if G == -1:
        return max(K, 1)
    if G < 1 or K % G:
        raise ValueError(
            f"group_size must divide K={K} (weight rows), or be -1/None for per-channel; "
            f"got group_size={group_size}"
        )
    return G


def _row_blocks(K: int, N: int):
    rows = max(1, _BLOCK_ELEMS // max(N, 1))
    for k0 in range(0, K, rows):
        yield k0, min(K, k0 + rows)


# The array type _round_up_to_storage stores each kind of scale in.
_STORED_TYPES = {"float16": np.float16, "bfloat16": np.uint16, "float32": np.float32}


def _round_up_to_storage(scale: np.ndarray, kind: str):
    """Round positive float32 scales up to the storage type.

    Returns (stored array, its exact float32 value). Rounding up rather than to
    nearest keeps (max - min) / stored <= 15, so zero points stay in 0..15 and
    no weight of the group is clamped by more than half a step.
    bfloat16 is stored as uint16 bits.
    """
    if kind == "float32":
        return scale, scale
    if kind == "float16":
        with np.errstate(over="ignore"):
            half = scale.astype(np.float16)
        # For positive values the next float16 up is the next bit pattern.
        below = half.astype(np.float32) < scale
        bits = half.view(np.uint16) + below.astype(np.uint16)
        stored = bits.view(np.float16)
        return stored, stored.astype(np.float32)
    # bfloat16 is the top half of a float32: truncate, then step up if anything was cut.
    wide = scale.view(np.uint32)
    cut = (wide & np.uint32(0xFFFF)) != 0
    bits = ((wide >> np.uint32(16)) + cut.astype(np.uint32)).astype(np.uint16)
    return bits, (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def _grid(lo, hi, scale_kind: str):
    """(stored scales, their exact float32 value, zero points as float32) of the
    groups whose float32 range, widened to include 0, is [lo, hi]."""
    width = hi - lo
    with np.errstate(over="ignore", invalid="ignore"):
        scale = np.where(
            width > 0,
            # a range so narrow that width / 15 underflows still gets a nonzero scale
            np.maximum(width / np.float32(15), np.finfo(np.float32).tiny),
            np.float32(1),
        ).astype(np.float32)
        stored, step = _round_up_to_storage(scale, scale_kind)
    if not np.isfinite(step).all():  # width overflowed, or the stored type did
        raise ValueError(
            f"weight has a range too wide for {scale_kind} scales "
            f"(max - min > 15 * the largest {scale_kind})"
        )
    return stored, step, np.clip(np.rint(-lo / step), 0, 15)


def quantize(weight, group_size=128, *, hessian=None, damp=0.01, grid=None, act_order=None,
             refine=None):
    """Asymmetric 4-bit quantization of weight [K, N] to the AWQ layout: round to
    nearest, or GPTQ rounding when the layer's input statistics are given.

    weight : float16, bfloat16, float32 or float64 [K, N] (K = in_features rows,
        N = out_features columns, a multiple of 8); NumPy (bfloat16 via ml_dtypes)
        or a torch tensor.
    group_size : G, which must divide K; -1 or None for per-channel (G = K).
    hessian : None, or a float [K, K] array (NumPy or torch): X^T X summed over
        inputs x (rows of X, length K) of the layer, y = x @ weight; a positive
        multiple of it (2 X^T X, a mean over inputs) serves as well.
    damp : with hessian, the share of the mean of its diagonal added to the
        diagonal (a real number >= 0), which keeps the inverse well conditioned.
    grid : how the grid of each group is chosen: "minmax" (the range of its values)
        or "mse" (that range shrunk, and the zero point moved, where this lowers the
        group's squared rounding error, each row's weighted by what it costs GPTQ when
        hessian is given). Default: "mse" with hessian, "minmax" without.
    act_order : with hessian, round the rows in order of decreasing diagonal of
        hessian, every grid fixed before the first row (True), or in order 0..K-1,
        each group's grid taken when the group starts (False). Default: True with
        hessian; without hessian only None and False are accepted.
    refine : with hessian, how many rounds of refinement follow GPTQ's rounding,
        each lowering its loss further with the grids' zero points kept (below); 0
        for GPTQ's rounding as it is. Default: 2 with hessian; without hessian only
        None and 0 are accepted.

    Returns (qweight int32 [K, N/8], qzeros int32 [K/G, N/8], scales [K/G, N]),
    NumPy arrays, or torch CPU tensors when weight is a tensor. scales have the
    weight's type (float16 for float64 weights).

    Every group of G rows and each column gets one grid, in float32, from a range
    [lo, hi] that includes 0: scale = (hi - lo) / 15, rounded up to the scales'
    type (1 for an all-zero range); zero = clamp(round(-lo / scale), 0, 15). A
    value w becomes q = clamp(round(w / scale) + zero, 0, 15), rounding half to
    even.

    grid="minmax": [lo, hi] is the range of the group's values, widened to include
    0 so that every group, even one of all-positive weights, is representable.
    Without hessian the values are the weights themselves, so |w - (q - zero) *
    scale| <= scale / 2 up to float32 rounding.

    grid="mse" (the clipping search of AWQ, Lin et al. 2023, and GPTQ's "mse"
    grid): the min-max range times a shrink factor p, tried at p = 1, 0.95, ..
    0.5, then at p +- 0.025, +- 0.0125 and +- 0.00625 around the best p so far
    (never above 1), then with the best grid's zero point moved by +-1; the grid
    kept is the one with the smallest sum over the group of d_k (w_k - (q_k -
    zero) * scale)^2, the earliest on ties. d_k is 1 without hessian; with
    hessian it is what an error in row k adds to GPTQ's loss (below), 1 / U[k,
    k]^2: the part of input k's energy (hessian[k, k], damped) that the inputs
    rounded after it cannot reproduce, and 0 for an input that is always zero (for
    a diagonal hessian and damp=0, hessian[k, k] itself). The min-max grid is the
    first tried, so no group and column ends with a larger weighted squared error
    than min-max's; values beyond a shrunk range are clamped to its ends, more
    than half a step away.

    With hessian (GPTQ, Frantar et al. 2022) the rows are rounded one after
    another, and the rounding error of each is fed into the rows not yet rounded
    along the inverse of H = hessian + damp * mean(diag) * I: the change of those
    rows that best cancels it in X weight, which keeps ||X weight - X W_q|| small
    (U is the upper triangular factor of H^-1 = U^T U, with rows and columns in
    the order of rounding).

    With act_order (GPTQ's activation order, with its "static groups") the rows
    with the largest hessian[k, k], whose errors cost most, go first, while the
    most rows remain to absorb their errors; all grids are taken from the weights
    as given, before any error is fed, so row k still belongs to group k // G and
    the layout is the AWQ layout. Without act_order the rows go in order 0..K-1
    and a group's grid is taken from its rows as they stand when the group starts
    (original values plus the errors fed into them). Either way a value pushed
    outside its grid is clamped to the grid's end. Inputs that are always zero (a
    zero diagonal entry) are rounded to nearest. A diagonal hessian feeds no error
    anywhere: with grid="minmax" it gives exactly the min-max result. H is
    symmetrized and factored in float64; the updates run in float32 through BLAS,
    so their last bits can depend on the BLAS build.

    Each round of refine (coordinate descent on GPTQ's loss, as in QuantEase,
    Behdin et al. 2023, then a least-squares fit of the scales) lowers the loss
    tr((W - W_q)^T H (W - W_q)) of the rounded weights, H damped as above, and
    never raises it. First every row, in turn, is set to its value nearest, on its
    grids, to the one that minimizes the loss with every other row as it stands:
    the exact minimum over that row, so the loss cannot rise. Then each column's
    scales, one a group, are fitted to that loss by least squares with the codes
    and zero points fixed, rounded to nearest in the scales' type, and kept for
    the columns whose loss they lower. GPTQ's order leaves errors that the rows
    rounded first could absorb better once the later rows are known; a pass over
    the rows sees all of them. The scales then no longer follow the grid's rule
    above, and a diagonal hessian gives min-max's values with refine=0 only.
    """
    w, scale_kind, torch = _weight_matrix(weight)
    K, N = w.shape
    G = _check_group_size(group_size, K)
    damp = _check_damp(damp)
    grid = _check_grid(grid, hessian is not None)
    act_order = _check_act_order(act_order, hessian is not None)
    refine = _check_refine(refine, hessian is not None)
    if hessian is None:
        qweight, qzeros, stored = _round_to_nearest(w, G, scale_kind, grid)
    else:
        h = _hessian_matrix(hessian, K)
        if not np.isfinite(w).all():
            raise ValueError("weight must be finite; it holds NaN or infinity")
        qweight, qzeros, stored = _gptq(w, G, scale_kind, h, damp, grid, act_order, refine)

    if torch is not None:
        if scale_kind == "bfloat16":
            scales = torch.from_numpy(stored.view(np.int16)).view(torch.bfloat16)
        else:
            scales = torch.from_numpy(stored)
        return torch.from_numpy(qweight), torch.from_numpy(qzeros), scales
    if scale_kind == "bfloat16":
        # A NumPy bfloat16 weight means ml_dtypes is installed.
        import ml_dtypes

        stored = stored.view(ml_dtypes.bfloat16)
    return qweight, qzeros, stored


_GRIDS = ("minmax", "mse")


def _check_grid(grid, with_hessian: bool) -> str:
    if grid is None:
        return "mse" if with_hessian else "minmax"
    if not isinstance(grid, str):
        raise TypeError(f"grid must be 'minmax' or 'mse' (or None for the default); got "
                        f"{type(grid).__name__}")
    if grid not in _GRIDS:
        raise ValueError(f"grid must be 'minmax' or 'mse'; got {grid!r}")
    return grid


def _check_act_order(act_order, with_hessian: bool) -> bool:
    if act_order is None:
        return with_hessian
    if not isinstance(act_order, (bool, np.bool_)):
        raise TypeError(f"act_order must be True, False or None (the default); got "
                        f"{type(act_order).__name__}")
    if act_order and not with_hessian:
        raise ValueError("act_order=True needs a hessian: the rows are ordered by its diagonal")
    return bool(act_order)


# Rounds of refinement after GPTQ by default. Each costs about as much as GPTQ itself,
# and each gains less than the one before (docs/PYTORCH.md has the figures).
_REFINE_ROUNDS = 2


def _check_refine(refine, with_hessian: bool) -> int:
    if refine is None:
        return _REFINE_ROUNDS if with_hessian else 0
    if isinstance(refine, (bool, np.bool_)) or not hasattr(type(refine), "__index__"):
        raise TypeError(f"refine must be an int >= 0 (or None for the default); got "
                        f"{type(refine).__name__}")
    rounds = operator.index(refine)
    if rounds < 0:
        raise ValueError(f"refine must be >= 0; got {refine!r}")
    if rounds and not with_hessian:
        raise ValueError("refine > 0 needs a hessian: it lowers GPTQ's loss, which the hessian "
                         "defines")
    return rounds


def _round_to_nearest(w: np.ndarray, G: int, scale_kind: str, grid: str):
    """(qweight, qzeros, stored scales) of every value rounded to nearest on its
    group's grid."""
    stored, step, zero = _group_grids(w, G, scale_kind, grid, None)
    return _round_rows(w, G, step, zero), _pack_nibbles(zero.astype(np.uint8)), stored


def _min_max_grids(w: np.ndarray, G: int, scale_kind: str):
    """_grid of every group's range, widened to include 0."""
    K, N = w.shape
    n_groups = K // G
    # Starting both bounds at 0 widens the range to include 0.
    lo = np.zeros((n_groups, N), dtype=np.float32)
    hi = np.zeros((n_groups, N), dtype=np.float32)
    for k0, k1 in _row_blocks(K, N):
        block = w[k0:k1].astype(np.float32)
        # The block's rows split into runs that each belong to one group.
        starts = np.unique(np.r_[k0, np.arange(-(-k0 // G) * G, k1, G)])
        group = starts // G
        lo[group] = np.minimum(lo[group], np.minimum.reduceat(block, starts - k0, axis=0))
        hi[group] = np.maximum(hi[group], np.maximum.reduceat(block, starts - k0, axis=0))

    if not (np.isfinite(lo).all() and np.isfinite(hi).all()):
        raise ValueError("weight must be finite; it holds NaN or infinity")
    return _grid(lo, hi, scale_kind)


def _round_rows(w: np.ndarray, G: int, step: np.ndarray, zero: np.ndarray) -> np.ndarray:
    """qweight of w rounded to nearest on the grids (step, zero) of its groups."""
    K, N = w.shape
    qweight = np.empty((K, N // 8), dtype=np.int32)
    for k0, k1 in _row_blocks(K, N):
        group = np.arange(k0, k1) // G
        block = w[k0:k1].astype(np.float32)
        q = np.clip(np.rint(block / step[group]) + zero[group], 0, 15)
        qweight[k0:k1] = _pack_nibbles(q.astype(np.uint8))
    return qweight


# --- the "mse" grid --------------------------------------------------------------

# Shrink factors of the min-max range tried first (1, 0.95, .. 0.5), then the
# half-widths of the steps around the best one (coarse to fine).
_SHRINKS = tuple(1 - 0.05 * i for i in range(11))
_REFINE = (0.025, 0.0125, 0.00625)


def _group_blocks(n_groups: int, G: int, N: int):
    """(first group, end group, first column, end column) of blocks of whole groups
    of about _BLOCK_ELEMS elements: several groups by all columns, or one group by
    some columns when a group is larger than that."""
    if G * N <= _BLOCK_ELEMS:
        groups = _BLOCK_ELEMS // max(G * N, 1)
        for g0 in range(0, n_groups, groups):
            yield g0, min(n_groups, g0 + groups), 0, N
    else:
        columns = max(1, _BLOCK_ELEMS // G)
        for g in range(n_groups):
            for c0 in range(0, N, columns):
                yield g, g + 1, c0, min(N, c0 + columns)


def _mse_grids(w: np.ndarray, G: int, scale_kind: str, weights):
    """(stored scales, step, zero) [K/G, N] of the "mse" grid of every group of w
    [K, N] (any float type); weights: None, or float32 [K], the weight of each
    row's squared error."""
    K, N = w.shape
    n_groups = K // G
    stored = np.empty((n_groups, N), dtype=_STORED_TYPES[scale_kind])
    step = np.empty((n_groups, N), dtype=np.float32)
    zero = np.empty((n_groups, N), dtype=np.float32)
    for g0, g1, c0, c1 in _group_blocks(n_groups, G, N):
        values = w[g0 * G:g1 * G, c0:c1].astype(np.float32).reshape(g1 - g0, G, c1 - c0)
        d = None if weights is None else weights[g0 * G:g1 * G].reshape(g1 - g0, G, 1)
        stored[g0:g1, c0:c1], step[g0:g1, c0:c1], zero[g0:g1, c0:c1] = _search_grid(
            values, d, scale_kind)
    return stored, step, zero


def _search_grid(values: np.ndarray, d, scale_kind: str):
    """The "mse" grid (stored, step, zero) [n, c] of the groups values [n, G, c]
    (float32), each row's squared error weighted by d [n, G, 1] (or 1)."""
    lo = np.minimum(values.min(axis=1), np.float32(0))
    hi = np.maximum(values.max(axis=1), np.float32(0))
    if not (np.isfinite(lo).all() and np.isfinite(hi).all()):
        raise ValueError("weight must be finite; it holds NaN or infinity")
    scaled = np.empty_like(values)
    rounded = np.empty_like(values)

    def try_grid(shrink, shift=0):
        """(weighted squared error [n, c] (float64), stored, step, zero) of one grid."""
        stored, step, zero = _grid(shrink * lo, shrink * hi, scale_kind)
        if shift:
            zero = np.clip(zero + np.float32(shift), 0, 15)
        # round(v / step), clamped so that q = round + zero stays in 0..15, minus
        # v / step: the rounding error in steps, as quantize rounds.
        np.divide(values, step[:, None], out=scaled)
        np.rint(scaled, out=rounded)
        np.clip(rounded, -zero[:, None], 15 - zero[:, None], out=rounded)
        np.subtract(rounded, scaled, out=rounded)
        np.square(rounded, out=rounded)
        if d is not None:
            np.multiply(rounded, d, out=rounded)
        total = rounded.sum(axis=1, dtype=np.float32).astype(np.float64)
        return total * np.square(step, dtype=np.float64), stored, step, zero

    best_error, *best = try_grid(np.ones_like(lo))
    best_shrink = np.ones_like(lo)

    def keep(shrink, shift=0):
        error, *grid = try_grid(shrink, shift)
        better = error < best_error  # strictly: on ties the earlier grid stays
        np.copyto(best_error, error, where=better)
        for kept, new in zip(best, grid):
            np.copyto(kept, new, where=better)
        if not shift:
            np.copyto(best_shrink, shrink, where=better)

    for p in _SHRINKS[1:]:
        keep(np.full_like(lo, p))
    for delta in _REFINE:
        around = best_shrink.copy()
        for sign in (-1, 1):
            keep(np.minimum(around + np.float32(sign * delta), np.float32(1)))
    around = best_shrink.copy()
    for shift in (-1, 1):
        keep(around, shift)
    return tuple(best)


# --- GPTQ rounding ---------------------------------------------------------------

# Rows quantized between two updates of the rows after them (GPTQ's lazy batch):
# the error of a block reaches the rest of the matrix in one matrix product.
_GPTQ_BLOCK = 128

# hessian must be symmetric up to the rounding of its accumulation (x.T @ x in
# float32 is not always exactly symmetric); a larger asymmetry is a wrong argument.
_SYMMETRY_TOLERANCE = 1e-3


def _check_damp(damp) -> float:
    if isinstance(damp, bool) or not isinstance(damp, (int, float, np.integer, np.floating)):
        raise TypeError(f"damp must be a real number >= 0; got {type(damp).__name__}")
    value = float(damp)
    if not (value >= 0 and np.isfinite(value)):
        raise ValueError(f"damp must be a finite number >= 0; got {damp!r}")
    return value


def _hessian_matrix(hessian, K: int) -> np.ndarray:
    """hessian as a symmetric float64 [K, K] NumPy array, or an exception naming it."""
    arr, _, _ = _matrix(hessian, "hessian", "a float16, bfloat16, float32 or float64 array",
                        _FLOAT_NAMES)
    if arr.shape != (K, K):
        raise ValueError(f"hessian must have shape [K, K] = [{K}, {K}] for a weight of {K} "
                         f"rows; got shape {arr.shape}")
    h = arr.astype(np.float64)  # a copy: the caller's array is never written
    if not np.isfinite(h).all():
        raise ValueError("hessian must be finite; it holds NaN or infinity")
    diag = np.diagonal(h)
    if (diag < 0).any():
        k = int(np.argmax(diag < 0))
        raise ValueError(f"hessian must be X^T X of the layer's inputs, whose diagonal is >= 0; "
                         f"got {float(diag[k])!r} at [{k}, {k}]")
    asymmetry = np.abs(h - h.T).max(initial=0.0)
    if asymmetry > _SYMMETRY_TOLERANCE * diag.max(initial=0.0):
        raise ValueError(f"hessian must be symmetric (X^T X of the layer's inputs); got "
                         f"|H - H^T| up to {asymmetry:.6g} for a diagonal up to "
                         f"{diag.max(initial=0.0):.6g}")
    h += h.T
    h *= 0.5
    # A zero on the diagonal of a positive semidefinite matrix forces its row to zero
    # (X^T X has one wherever an input is always 0); with other entries it is no X^T X.
    # Entries as small as the symmetry tolerance pass: inputs so small that their squares
    # underflow in float32 can leave such products beside a zero diagonal.
    dead = np.flatnonzero(diag == 0)
    live = np.abs(h[dead]) > _SYMMETRY_TOLERANCE * diag.max(initial=0.0)
    if live.any():
        k = int(dead[np.argmax(live.any(axis=1))])
        raise ValueError(f"hessian must be X^T X of the layer's inputs: [{k}, {k}] is 0 but "
                         f"row {k} is not, so it is not positive semidefinite")
    return h


def _inverse_factor(h: np.ndarray, damp: float) -> np.ndarray:
    """The upper triangular U with U^T U = (h + damp * mean(diag h) * I)^-1, float64.

    Row k of U, divided by U[k, k], is how the rounding error of row k of the
    weight is spread over rows k+1.. (entries before k are 0): the rows after k
    absorb it as well as X^T X allows, with rows 0..k held fixed. h is overwritten."""
    K = h.shape[0]
    diag = np.diagonal(h).copy()
    mean = diag.mean() if K else 0.0
    # An input that is always zero has a zero row and column; a positive diagonal
    # entry makes H invertible there and decouples that row from the others.
    dead = np.flatnonzero(diag == 0)
    h[dead, dead] = 1.0
    h[np.diag_indices(K)] += damp * mean
    # With J the row reversal, J H J = M M^T (Cholesky, M lower triangular) gives
    # H^-1 = U^T U for U = J M^-1 J, which is upper triangular: one factorization
    # and one inverse instead of inverting H and factoring the inverse.
    try:
        lower = np.linalg.cholesky(h[::-1, ::-1])
    except np.linalg.LinAlgError:
        raise ValueError(
            f"hessian + damp * mean(diag) * I is not positive definite (damp={damp}); hessian "
            f"must be X^T X of the layer's inputs; a larger damp helps when it is nearly "
            f"singular") from None
    return np.ascontiguousarray(np.linalg.inv(lower)[::-1, ::-1])


def _gptq(w: np.ndarray, G: int, scale_kind: str, h: np.ndarray, damp: float, grid: str,
          act_order: bool, refine: int):
    """(qweight, qzeros, stored scales) of GPTQ rounding with the hessian h (float64,
    symmetric, overwritten), followed by `refine` rounds of _refine."""
    K, N = w.shape
    n_groups = K // G
    W = w.astype(np.float32)  # a copy, updated with the errors of the rows rounded before
    diag = np.diagonal(h).copy()
    # The stable sort keeps ties, and the inputs that are always zero, in row order.
    order = np.argsort(-diag, kind="stable") if act_order else np.arange(K)
    if act_order:
        h = h[np.ix_(order, order)]
    U = _inverse_factor(h, damp)
    # GPTQ's loss grows by e^2 / U[k, k]^2 when the k-th row rounded is off by e:
    # 1 / U[k, k]^2 is the part of that input's energy that the inputs rounded after
    # it cannot reproduce. An input that is always zero costs nothing. Only ratios
    # matter: scaled to at most 1, the costs fit float32 for any multiple of X^T X.
    cost = np.zeros(K)
    live = diag[order] > 0
    cost[order[live]] = 1 / np.square(np.diagonal(U)[live])
    cost = (cost / cost.max(initial=1e-300)).astype(np.float32)
    U = U.astype(np.float32)
    if act_order:
        # Static groups: every grid comes from the weights as given.
        stored, step, zero = _group_grids(W, G, scale_kind, grid, cost)
        W = W[order]
        blocks = [(b0, min(b0 + _GPTQ_BLOCK, K)) for b0 in range(0, K, _GPTQ_BLOCK)]
    else:
        stored = np.empty((n_groups, N), dtype=_STORED_TYPES[scale_kind])
        step = np.empty((n_groups, N), dtype=np.float32)
        zero = np.empty((n_groups, N), dtype=np.float32)
        # Every group starts a block, so that when its grid is taken every row of the
        # group holds the errors of all the rows before it.
        size = min(G, _GPTQ_BLOCK)
        blocks = [(b0, min(b0 + size, g0 + G)) for g0 in range(0, K, G)
                  for b0 in range(g0, g0 + G, size)]
    q = np.empty((K, N), dtype=np.uint8)
    errors = np.empty((_GPTQ_BLOCK, N), dtype=np.float32)
    for b0, b1 in blocks:
        if not act_order and b0 % G == 0:
            g = b0 // G
            rows = W[b0:b0 + G]
            if not np.isfinite(rows).all():
                raise ValueError(_DIVERGED)
            group_grid = _group_grids(rows, G, scale_kind, grid, cost[b0:b0 + G])
            stored[g], step[g], zero[g] = (a[0] for a in group_grid)
        for k in range(b0, b1):
            g = order[k] // G
            s, z = step[g], zero[g]
            # The errors of this block's rows before k (the earlier blocks' are in W).
            row = W[k] - U[b0:k, k] @ errors[:k - b0] if k > b0 else W[k]
            qk = np.clip(np.rint(row / s) + z, 0, 15)
            errors[k - b0] = (row - (qk - z) * s) / U[k, k]
            q[order[k]] = qk
        if not np.isfinite(errors[:b1 - b0]).all():
            raise ValueError(_DIVERGED)
        if b1 < K:
            W[b1:] -= U[b0:b1, b1:].T @ errors[:b1 - b0]
    if refine:
        del W, U
        # _inverse_factor left the damped hessian in h, in the order of rounding. An
        # input that is always zero costs nothing: its diagonal entry goes back to 0.
        dead = np.flatnonzero(~live)
        h[dead, dead] = 0
        if act_order:
            back = np.argsort(order)
            h = h[np.ix_(back, back)]
        q, step, stored = _refine(w, q, G, step, stored, zero, h.astype(np.float32),
                                  scale_kind, refine)
    return _pack_nibbles(q), _pack_nibbles(zero.astype(np.uint8)), stored


def _refine(w: np.ndarray, q: np.ndarray, G: int, step: np.ndarray, stored: np.ndarray,
            zero: np.ndarray, h: np.ndarray, scale_kind: str, rounds: int):
    """(q, step, stored) after `rounds` rounds of a coordinate-descent pass over the
    rows of q, then a least-squares refit of the scales, on the loss
    tr((w - W_q)^T h (w - W_q)); h is the damped hessian, float32, in row order, with
    0 on the diagonal of the inputs that are always zero (whose rows keep their codes)."""
    w = w.astype(np.float32, copy=False)
    for _ in range(rounds):
        residual = _descend(w, q, G, step, zero, h)
        step, stored = _refit_scales(q, G, step, stored, zero, h, residual, scale_kind)
    return q, step, stored


def _descend(w: np.ndarray, q: np.ndarray, G: int, step: np.ndarray, zero: np.ndarray,
             h: np.ndarray) -> np.ndarray:
    """One pass over the rows of q (uint8 [K, N], updated in place), each set to the
    codes nearest to the row that minimizes the loss with every other row fixed.
    Returns h @ (w - W_q) after the pass, float32 [K, N]."""
    K, N = w.shape
    group = np.arange(K) // G
    error = np.empty((K, N), dtype=np.float32)  # w - W_q
    for k0, k1 in _row_blocks(K, N):
        g = group[k0:k1]
        error[k0:k1] = w[k0:k1] - (q[k0:k1] - zero[g]) * step[g]
    # The loss changes by 2 d residual[k] + h[k, k] d^2 when row k of the error
    # changes by d, for every column: the best d is -residual[k] / h[k, k], and on a
    # grid the value nearest to it, since the change is a parabola in each column.
    residual = h @ error
    changes = np.empty((_GPTQ_BLOCK, N), dtype=np.float32)
    for b0 in range(0, K, _GPTQ_BLOCK):
        b1 = min(b0 + _GPTQ_BLOCK, K)
        for k in range(b0, b1):
            if h[k, k] == 0:  # an input that is always zero: its row costs nothing
                changes[k - b0] = 0
                continue
            # The changes of this block's rows before k (the earlier blocks' are in residual).
            r = residual[k] + h[k, b0:k] @ changes[:k - b0] if k > b0 else residual[k]
            s, z = step[group[k]], zero[group[k]]
            best = w[k] - error[k] + r / h[k, k]
            qk = np.clip(np.rint(best / s) + z, 0, 15)
            new = w[k] - (qk - z) * s
            changes[k - b0] = new - error[k]
            error[k] = new
            q[k] = qk
        residual += h[:, b0:b1] @ changes[:b1 - b0]
    return residual


def _refit_scales(q: np.ndarray, G: int, step: np.ndarray, stored: np.ndarray,
                  zero: np.ndarray, h: np.ndarray, residual: np.ndarray, scale_kind: str):
    """(step, stored) with each column's scales refitted by least squares to the
    loss, codes and zero points fixed, where the refit, rounded to the scales' type,
    lowers the column's loss. residual: h @ (w - W_q) for the current scales."""
    K, N = q.shape
    n_groups = K // G
    step, stored = step.copy(), stored.copy()
    # Column n's weights are A s, A [K, K/G] holding q - zero of each row in its
    # group's column; the loss is s^T M s - 2 s^T r + const with M = A^T h A and
    # r = A^T h w, where h w = residual + h A s.
    columns = max(1, min(N, _BLOCK_ELEMS // max(K, n_groups * n_groups)))
    for c0 in range(0, N, columns):
        c1 = min(N, c0 + columns)
        a = (q[:, c0:c1] - np.repeat(zero[:, c0:c1], G, axis=0)).astype(np.float32)
        old = step[:, c0:c1]
        hw = residual[:, c0:c1].copy()
        m = np.empty((c1 - c0, n_groups, n_groups))
        for g in range(n_groups):
            rows = slice(g * G, (g + 1) * G)
            t = h[:, rows] @ a[rows]
            m[:, :, g] = (a * t).reshape(n_groups, G, c1 - c0).sum(axis=1).T
            hw += t * old[g]
        r = (a * hw).reshape(n_groups, G, c1 - c0).sum(axis=1).T.astype(np.float64)
        m = 0.5 * (m + m.transpose(0, 2, 1))
        current = old.T.astype(np.float64)
        # A group whose codes all equal its zero point has no say in the loss: it
        # keeps its scale (M's row and column are 0 there).
        idle = np.diagonal(m, axis1=1, axis2=2) == 0
        cols, groups = np.nonzero(idle)
        m[cols, groups, groups] = 1
        r[idle] = current[idle]
        with np.errstate(all="ignore"):
            try:
                fitted = np.linalg.solve(m, r[..., None])[..., 0]
            except np.linalg.LinAlgError:
                continue  # a singular M (codes of a degenerate hessian): keep the scales
            ok = np.isfinite(fitted).all(axis=1) & (fitted > 0).all(axis=1)
            fitted = np.where(ok[:, None], fitted, current).astype(np.float32)
            new_stored, exact = _round_to_storage(fitted, scale_kind)
            ok &= np.isfinite(exact).all(axis=1) & (exact > 0).all(axis=1)

            def loss(s):
                return np.einsum("ci,cij,cj->c", s, m, s) - 2 * np.einsum("ci,ci->c", s, r)

            better = ok & (loss(exact.astype(np.float64)) < loss(current))
        keep = np.flatnonzero(better)
        step[:, c0 + keep] = exact[keep].T
        stored[:, c0 + keep] = new_stored[keep].T
    return step, stored


def _round_to_storage(scale: np.ndarray, kind: str):
    """(stored array, its exact float32 value) of positive float32 scales rounded to
    nearest in the storage type (_round_up_to_storage's layout): the contract's
    rounding, reference._round_to."""
    stored = _round_to(scale, kind)
    return stored, _to_float32(stored, kind)


_DIVERGED = "the rounding errors grew without bound (hessian nearly singular); raise damp"


def _group_grids(w: np.ndarray, G: int, scale_kind: str, grid: str, weights):
    """(stored, step, zero) of every group of w by `grid`; weights [K] float32 weigh
    each row's squared error in the "mse" search."""
    if grid == "minmax":
        return _min_max_grids(w, G, scale_kind)
    return _mse_grids(w, G, scale_kind, weights)
