"""Pure-NumPy reference for AWQ dequantization: the oracle every backend is tested against.

Written from DESIGN.md section 1 alone, independently of csrc/; it never imports the
compiled extension. It prefers being obviously right to being fast, but works in
vectorised row blocks so that a 4096 x 14336 layer takes a few seconds.

The AWQ "GEMM" layout (defined here, once, for the whole package)
----------------------------------------------------------------
``qweight`` is int32 or uint32 ``[K, N/8]``: every 32-bit word packs eight 4-bit
values. Nibble ``i`` (bits ``4i .. 4i+3``, ``i = 0`` least significant) of word
``[k, c]`` holds column ``n = 8c + ORDER[i]``; read the other way, column ``8c + j``
lives in nibble ``REVERSE[j]``. ``qzeros`` ``[K/G, N/8]`` is packed the same way and
``scales`` is ``[K/G, N]``. Then::

    q = (qweight[k, n // 8] >> (4 * REVERSE[n % 8])) & 0xF
    z = (qzeros[k // G, n // 8] >> (4 * REVERSE[n % 8])) & 0xF
    out[k, n] = round_to_out(float32(q - z) * float32(scales[k // G, n]))

``q - z`` is formed as an integer, the product is taken in float32, and the only
rounding is the final round-to-nearest-even to the output type.

bfloat16 in NumPy
-----------------
NumPy has no bfloat16; ``ml_dtypes.bfloat16`` provides one and is an optional
dependency here. When ml_dtypes is importable, bfloat16 results are
``ml_dtypes.bfloat16`` arrays. Without it they are ``uint16`` arrays holding the
bfloat16 bit patterns, and, by the same convention, a ``uint16`` array is read as
bfloat16 bits wherever this module expects a float array (scales, ``to_bits``,
``assert_bitexact``).
"""

from __future__ import annotations

import operator
import sys

import numpy as np

__all__ = ["ORDER", "REVERSE", "dequantize", "to_bits", "assert_bitexact"]

# Nibble i of a packed word holds column 8c + ORDER[i] ...
ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
# ... so column 8c + j is read from nibble REVERSE[j] (REVERSE is ORDER's inverse).
REVERSE = (0, 4, 1, 5, 2, 6, 3, 7)

# The element types of scales and results: the package's one list of them.
DTYPES = ("float16", "bfloat16", "float32")

# Bit offset of column j (of each run of 8 columns) inside its word.
_COLUMN_SHIFTS = np.array([4 * nibble for nibble in REVERSE], dtype=np.uint32)

# Elements per row block: bounds the temporaries (~20 bytes per element) to a few
# tens of MB whatever the layer size. Tests shrink it to exercise block edges.
_BLOCK_ELEMS = 1 << 20

# Canonical NaN of each type for bit comparisons: sign and payload dropped.
_CANONICAL_NAN = {"float16": 0x7E00, "bfloat16": 0x7FC0, "float32": 0x7FC00000}
# (exponent mask, mantissa mask) of each type: NaN = all-ones exponent, mantissa != 0.
_NAN_MASKS = {
    "float16": (0x7C00, 0x03FF),
    "bfloat16": (0x7F80, 0x007F),
    "float32": (0x7F800000, 0x007FFFFF),
}


def _nan_mask(bits, kind: str):
    """Where a bit array (NumPy or torch) of type `kind` holds a NaN."""
    exponent, mantissa = _NAN_MASKS[kind]
    return ((bits & exponent) == exponent) & ((bits & mantissa) != 0)


def _ml_bfloat16():
    """ml_dtypes.bfloat16, or None when ml_dtypes is not installed."""
    try:
        import ml_dtypes
    except ImportError:
        return None
    return ml_dtypes.bfloat16


def _to_numpy(x) -> np.ndarray:
    """A NumPy view or copy of a NumPy array, torch tensor (any device) or CuPy array.

    torch is never imported here: a tensor can only exist if its caller imported it.
    torch.bfloat16 comes back as ml_dtypes.bfloat16, or as uint16 bits without it.
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        t = x.detach().cpu()
        if t.dtype == torch.bfloat16:
            # NumPy cannot take a bfloat16 tensor: go through its bits.
            bits = t.view(torch.int16).numpy().view(np.uint16)
            bf16 = _ml_bfloat16()
            return bits if bf16 is None else bits.view(bf16)
        return t.numpy()
    if type(x).__module__.split(".")[0] == "cupy":
        return x.get()
    return np.asarray(x)


def _float_kind(arr: np.ndarray) -> str | None:
    """'float16' / 'bfloat16' / 'float32' for arrays this module can read, else None."""
    if arr.dtype == np.float16:
        return "float16"
    if arr.dtype == np.float32:
        return "float32"
    if arr.dtype == np.uint16 or arr.dtype.name == "bfloat16":
        return "bfloat16"
    return None


def _dtype_name(dtype) -> str:
    """Normalise an out_dtype given as a string, NumPy/ml_dtypes type or torch dtype."""
    expected = "'float16', 'bfloat16' or 'float32' (a string, NumPy/ml_dtypes type or torch dtype)"
    if isinstance(dtype, str):
        if dtype in DTYPES:
            return dtype
        raise TypeError(f"out_dtype must be {expected}; got {dtype!r}")
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(dtype, torch.dtype):
        name = str(dtype).removeprefix("torch.")
        if name in DTYPES:
            return name
        raise TypeError(f"out_dtype must be {expected}; got {dtype}")
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = None
    if name in DTYPES:
        return name
    raise TypeError(f"out_dtype must be {expected}; got {dtype!r}")


def _packed_words(x, name: str) -> np.ndarray:
    """Validate a packed int32/uint32 2-D array and view it as uint32."""
    arr = _to_numpy(x)
    if arr.dtype not in (np.int32, np.uint32):
        raise TypeError(f"{name} must be int32 or uint32; got {arr.dtype}")
    if arr.ndim != 2:
        raise ValueError(f"{name} must be 2-D; got shape {arr.shape}")
    return np.ascontiguousarray(arr).view(np.uint32)


def _group_size(group_size, K: int, n_groups: int) -> int:
    if group_size is None:
        if n_groups == 0:
            if K:
                raise ValueError(f"scales has 0 rows but qweight has K={K} rows")
            return 1  # nothing to compute
        if K % n_groups:
            raise ValueError(
                f"cannot infer group_size: K={K} (qweight rows) is not a multiple of "
                f"{n_groups} (scales rows)"
            )
        return K // n_groups
    G = operator.index(group_size)
    if G == -1:
        G = K  # per channel, as in the package's dequantize
    if G < 1:
        raise ValueError(f"group_size must be >= 1; got {G}")
    if K % G:
        raise ValueError(f"group_size={G} must divide K={K} (qweight rows)")
    if K // G != n_groups:
        raise ValueError(
            f"scales has {n_groups} rows; K/group_size = {K}/{G} = {K // G} expected"
        )
    return G


def _nibbles(words: np.ndarray) -> np.ndarray:
    """uint32 [R, W] -> int16 [R, 8W]: column 8c + j is nibble REVERSE[j] of word c."""
    values = (words[:, :, None] >> _COLUMN_SHIFTS) & np.uint32(0xF)
    return values.reshape(words.shape[0], -1).astype(np.int16)


def _to_float32(values: np.ndarray, kind: str) -> np.ndarray:
    """Exact widening of float16 / bfloat16 / float32 values to float32."""
    if kind == "bfloat16":
        # bfloat16 is the top half of a float32: shift the bits into place.
        bits = np.ascontiguousarray(values).view(np.uint16)
        return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return values.astype(np.float32, copy=False)


def _float32_to_bfloat16_bits(x: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 to nearest, ties to even; returns uint16 bits.

    Adding 0x7FFF plus the lowest kept bit, then dropping the 16 low bits, rounds
    up exactly when the dropped half is above 0x8000, or equal to it with an odd
    kept part. Overflow carries into the exponent and yields infinity, as IEEE
    rounding does. NaN would carry into garbage, so it becomes a quiet NaN with
    its sign kept instead.
    """
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    lowest_kept = (bits >> np.uint32(16)) & np.uint32(1)
    rounded = (bits + np.uint32(0x7FFF) + lowest_kept) >> np.uint32(16)
    quiet_nan = (bits >> np.uint32(16)) | np.uint32(0x0040)
    return np.where(np.isnan(x), quiet_nan, rounded).astype(np.uint16)


def _round_to(x: np.ndarray, kind: str) -> np.ndarray:
    """The one rounding of the contract: float32 -> output type (bits for bfloat16)."""
    if kind == "float32":
        return x
    if kind == "float16":
        with np.errstate(over="ignore", invalid="ignore"):
            return x.astype(np.float16)  # NumPy rounds to nearest even
    return _float32_to_bfloat16_bits(x)


def dequantize(qweight, qzeros, scales, group_size=None, out_dtype=None) -> np.ndarray:
    """Dequantize AWQ-packed weights exactly as DESIGN.md section 1 specifies.

    qweight : int32 or uint32 [K, N/8]
    qzeros  : int32 or uint32 [K/G, N/8]
    scales  : float16, bfloat16 or float32 [K/G, N]
        NumPy arrays, torch tensors (any device) or CuPy arrays.
    group_size : G; None infers K // scales.shape[0]; -1 means G = K.
    out_dtype : None (the scales' type), 'float16' / 'bfloat16' / 'float32',
        np.float16 / np.float32, ml_dtypes.bfloat16 or a torch dtype.

    Returns a NumPy array [K, N]; bfloat16 results are ml_dtypes.bfloat16, or
    uint16 bit patterns when ml_dtypes is not installed.
    """
    words = _packed_words(qweight, "qweight")
    zero_words = _packed_words(qzeros, "qzeros")
    scales = _to_numpy(scales)
    scale_kind = _float_kind(scales)
    if scale_kind is None:
        raise TypeError(f"scales must be float16, bfloat16 or float32; got {scales.dtype}")
    if scales.ndim != 2:
        raise ValueError(f"scales must be 2-D; got shape {scales.shape}")

    K, W = words.shape
    N = 8 * W
    n_groups = scales.shape[0]
    if scales.shape[1] != N:
        raise ValueError(
            f"scales has {scales.shape[1]} columns; 8 * qweight columns = {N} expected"
        )
    if zero_words.shape != (n_groups, W):
        raise ValueError(
            f"qzeros has shape {zero_words.shape}; (scales rows, qweight columns) = "
            f"{(n_groups, W)} expected"
        )
    G = _group_size(group_size, K, n_groups)
    out_kind = scale_kind if out_dtype is None else _dtype_name(out_dtype)

    storage = {"float16": np.float16, "bfloat16": np.uint16, "float32": np.float32}
    out = np.empty((K, N), dtype=storage[out_kind])
    rows_per_block = max(1, _BLOCK_ELEMS // max(N, 1))
    for k0 in range(0, K, rows_per_block):
        k1 = min(K, k0 + rows_per_block)
        group = np.arange(k0, k1) // G  # the group of every row of the block
        q_minus_z = _nibbles(words[k0:k1]) - _nibbles(zero_words[group])
        scale = _to_float32(scales[group], scale_kind)
        with np.errstate(invalid="ignore", over="ignore"):  # 0 * inf is NaN, by design
            product = q_minus_z.astype(np.float32) * scale
        out[k0:k1] = _round_to(product, out_kind)

    if out_kind == "bfloat16":
        bf16 = _ml_bfloat16()
        if bf16 is not None:
            return out.view(bf16)
    return out


def _bits_and_kind(arr, name: str) -> tuple[np.ndarray, str]:
    a = _to_numpy(arr)
    kind = _float_kind(a)
    if kind is None:
        raise TypeError(f"{name} must be float16, bfloat16 or float32; got {a.dtype}")
    bits_type = np.uint32 if kind == "float32" else np.uint16
    return np.ascontiguousarray(a).view(bits_type), kind


def to_bits(arr) -> np.ndarray:
    """The bit patterns of a float16 / bfloat16 / float32 array.

    float16 and bfloat16 give uint16, float32 gives uint32. Accepts NumPy arrays,
    torch tensors (any device) and CuPy arrays; a uint16 array is taken as
    bfloat16 bits and returned as is.
    """
    return _bits_and_kind(arr, "arr")[0]


def _value_of(bits: int, kind: str) -> float:
    """A bit pattern read back as a number, for error messages."""
    if kind == "float16":
        return float(np.array(bits, dtype=np.uint16).view(np.float16))
    if kind == "bfloat16":
        return float(np.array(bits << 16, dtype=np.uint32).view(np.float32))
    return float(np.array(bits, dtype=np.uint32).view(np.float32))


def assert_bitexact(actual, expected) -> None:
    """Assert two float arrays are bit-for-bit identical, NaN payloads aside.

    Both sides may be NumPy arrays, torch tensors (any device) or CuPy arrays, of
    the same type (float16, bfloat16 or float32) and shape. Every NaN compares
    equal to every other NaN (sign and payload ignored); everything else,
    the sign of zero included, must match bit for bit. On failure the
    AssertionError gives the mismatch count, the first mismatching index and both
    bit patterns.
    """
    a, a_kind = _bits_and_kind(actual, "actual")
    e, e_kind = _bits_and_kind(expected, "expected")
    if a_kind != e_kind:
        raise AssertionError(f"dtype differs: actual is {a_kind}, expected is {e_kind}")
    if a.shape != e.shape:
        raise AssertionError(f"shape differs: actual {a.shape}, expected {e.shape}")

    def canonical(bits):
        return np.where(_nan_mask(bits, a_kind), bits.dtype.type(_CANONICAL_NAN[a_kind]), bits)

    a, e = canonical(a), canonical(e)
    differs = a != e
    count = int(np.count_nonzero(differs))
    if count:
        index = np.unravel_index(int(np.argmax(differs)), differs.shape)
        index = tuple(int(i) for i in index)
        got, want = int(a[index]), int(e[index])
        width = 8 if a_kind == "float32" else 4
        raise AssertionError(
            f"{count} of {a.size} {a_kind} elements differ; first at index {index}: "
            f"actual 0x{got:0{width}x} ({_value_of(got, a_kind)!r}), "
            f"expected 0x{want:0{width}x} ({_value_of(want, a_kind)!r})"
        )
