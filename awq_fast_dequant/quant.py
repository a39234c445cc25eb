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

from .reference import DTYPES, REVERSE

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


def quantize(weight, group_size=128):
    """Asymmetric 4-bit min-max quantization of weight [K, N] to the AWQ layout.

    weight : float16, bfloat16, float32 or float64 [K, N] (K = in_features rows,
        N = out_features columns, a multiple of 8); NumPy (bfloat16 via ml_dtypes)
        or a torch tensor.
    group_size : G, which must divide K; -1 or None for per-channel (G = K).

    Returns (qweight int32 [K, N/8], qzeros int32 [K/G, N/8], scales [K/G, N]),
    NumPy arrays, or torch CPU tensors when weight is a tensor. scales have the
    weight's type (float16 for float64 weights).

    Per group of G rows and per column, in float32: the range [lo, hi] is the
    min and max of the group widened to include 0, so that every group, even one
    of all-positive weights, is representable; scale = (hi - lo) / 15, rounded up
    to the scales' type (1 for an all-zero group); zero = clamp(round(-lo / scale),
    0, 15); q = clamp(round(w / scale) + zero, 0, 15), rounding half to even.
    Then |w - (q - zero) * scale| <= scale / 2 up to float32 rounding.
    """
    w, scale_kind, torch = _weight_matrix(weight)
    K, N = w.shape
    G = _check_group_size(group_size, K)
    n_groups = K // G

    # Pass 1: per-group range. Starting both bounds at 0 widens it to include 0.
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
    zero = np.clip(np.rint(-lo / step), 0, 15)

    # Pass 2: 4-bit values, packed block by block.
    qweight = np.empty((K, N // 8), dtype=np.int32)
    for k0, k1 in _row_blocks(K, N):
        group = np.arange(k0, k1) // G
        block = w[k0:k1].astype(np.float32)
        q = np.clip(np.rint(block / step[group]) + zero[group], 0, 15)
        qweight[k0:k1] = _pack_nibbles(q.astype(np.uint8))
    qzeros = _pack_nibbles(zero.astype(np.uint8))

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
