"""Tests of the NumPy oracle (awq_fast_dequant.reference).

The worked examples below are computed by hand from DESIGN.md section 1, so that
the reference itself is checked against something other than code.
"""

import numpy as np
import pytest

from awq_fast_dequant import reference
from awq_fast_dequant.reference import ORDER, REVERSE, assert_bitexact, to_bits

from conftest import WORKED_QWEIGHT, WORKED_QZEROS, random_words, words


def f16(*bits):
    """float16 values from their bit patterns."""
    return np.array(bits, dtype=np.uint16).view(np.float16)


def f32(*bits):
    """float32 values from their bit patterns."""
    return np.array(bits, dtype=np.uint32).view(np.float32)


# --- the layout constants -------------------------------------------------


def test_reverse_is_the_inverse_of_order():
    assert sorted(ORDER) == list(range(8))
    for nibble, column in enumerate(ORDER):
        assert REVERSE[column] == nibble


# --- one word, by hand ----------------------------------------------------
#
# The words WORKED_QWEIGHT = 0xBE0F92A7 and WORKED_QZEROS = 0x12345678, whose q
# and z by column are worked out in conftest.py:
#     column   0  1  2  3  4  5  6  7
#     q        7 15 10  0  2 14  9 11
#     z        8  4  7  3  6  2  5  1
#     q - z   -1 11  3 -3 -4 12  4 10
#
# float16 scales and the float16 results (each product is exact in float32,
# then rounded once to float16, to nearest even):
#   col 0: -1 * 0.5    (0x3800) = -0.5                       -> 0xB800
#   col 1: 11 * 1.0009765625 (0x3C01, 1 + 2^-10) = 11 + 11 * 2^-10.
#          In [8, 16) the float16 step is 2^-7; 11 * 2^-10 = 1.375 steps,
#          which rounds to 1 step: 11 + 2^-7. 11 = 1.375 * 2^3: exponent
#          field 3 + 15 = 18, mantissa 0.375 * 1024 = 0x180 -> 0x4980, + 1 -> 0x4981
#   col 2: 3 * 1.0009765625 = 3 + 3 * 2^-10. In [2, 4) the step is 2^-9, so
#          this is 1.5 steps past 3: a tie between mantissas 0x201 (odd) and
#          0x202 (even) -> 0x202. 3 = 1.5 * 2^1: exponent 16 -> 0x4000 | 0x202 = 0x4202
#   col 3: -3 * -2.0   (0xC000) = 6.0 = 1.5 * 2^2: 0x4400 | 0x200 -> 0x4600
#   col 4: -4 * 0.25   (0x3400) = -1.0                       -> 0xBC00
#   col 5: 12 * 2^-24  (0x0001, the smallest subnormal) = 12 subnormal steps -> 0x000C
#   col 6:  4 * 65504  (0x7BFF, the largest float16) = 262016, beyond 65520
#          (the rounding boundary of the largest float16)    -> +inf 0x7C00
#   col 7: 10 * 1.5    (0x3E00) = 15.0 = 1.875 * 2^3: 0x4800 | 0x380 -> 0x4B80

WORKED_SCALES = (0x3800, 0x3C01, 0x3C01, 0xC000, 0x3400, 0x0001, 0x7BFF, 0x3E00)
WORKED_F16_OUT = (0xB800, 0x4981, 0x4202, 0x4600, 0xBC00, 0x000C, 0x7C00, 0x4B80)


def test_worked_example_float16():
    out = reference.dequantize(
        words(WORKED_QWEIGHT).reshape(1, 1),
        words(WORKED_QZEROS).reshape(1, 1),
        f16(*WORKED_SCALES).reshape(1, 8),
    )
    assert out.dtype == np.float16
    assert to_bits(out).tolist() == [list(WORKED_F16_OUT)]


def test_worked_example_float32_out_is_the_exact_product():
    # Same word; with float32 out there is no final rounding to float16.
    out = reference.dequantize(
        words(WORKED_QWEIGHT).reshape(1, 1),
        words(WORKED_QZEROS).reshape(1, 1),
        f16(*WORKED_SCALES).reshape(1, 8),
        out_dtype="float32",
    )
    expected = [-0.5, 11 + 11 / 1024, 3 + 3 / 1024, 6.0, -1.0, 12 * 2.0**-24, 262016.0, 15.0]
    assert out.dtype == np.float32
    assert out[0].tolist() == expected


def test_uint32_and_int32_words_are_the_same_input():
    scales = f16(*WORKED_SCALES).reshape(1, 8)
    as_int = reference.dequantize(
        words(WORKED_QWEIGHT).reshape(1, 1), words(WORKED_QZEROS).reshape(1, 1), scales
    )
    as_uint = reference.dequantize(
        np.array([[WORKED_QWEIGHT]], dtype=np.uint32),
        np.array([[WORKED_QZEROS]], dtype=np.uint32),
        scales,
    )
    assert_bitexact(as_uint, as_int)


def test_row_k_uses_group_k_over_g():
    # K = 4, G = 2, N = 8. Every q is 3; group 0 has zero 1, group 1 zero 0.
    qweight = words(*[0x33333333] * 4).reshape(4, 1)
    qzeros = words(0x11111111, 0x00000000).reshape(2, 1)
    scales = np.array([[0.5] * 8, [2.0] * 8], dtype=np.float32)
    out = reference.dequantize(qweight, qzeros, scales)
    # rows 0, 1: (3 - 1) * 0.5 = 1; rows 2, 3: (3 - 0) * 2 = 6
    assert out[:, 0].tolist() == [1.0, 1.0, 6.0, 6.0]
    assert (out == out[:, :1]).all()
    # group_size given explicitly gives the same
    assert_bitexact(reference.dequantize(qweight, qzeros, scales, group_size=2), out)


def loop_oracle(qweight, qzeros, scales, G):
    """The formula of DESIGN.md section 1, one element at a time (float16 out)."""
    K, N = qweight.shape[0], 8 * qweight.shape[1]
    out = np.empty((K, N), dtype=np.float16)
    for k in range(K):
        for n in range(N):
            shift = 4 * REVERSE[n % 8]
            q = (int(qweight[k, n // 8]) & 0xFFFFFFFF) >> shift & 0xF
            z = (int(qzeros[k // G, n // 8]) & 0xFFFFFFFF) >> shift & 0xF
            out[k, n] = np.float16(np.float32(q - z) * np.float32(scales[k // G, n]))
    return out


@pytest.mark.parametrize("block_elems", [24, 72, 1 << 20])  # 1 row, 3 rows, all
def test_vectorised_reference_matches_element_loop(monkeypatch, block_elems):
    # Small row blocks make blocks end inside groups and across group edges.
    monkeypatch.setattr(reference, "_BLOCK_ELEMS", block_elems)
    rng = np.random.default_rng(1)
    K, N, G = 12, 24, 4
    qweight = random_words(rng, (K, N // 8))
    qzeros = random_words(rng, (K // G, N // 8))
    scales = (rng.standard_normal((K // G, N)) * 0.01).astype(np.float16)
    out = reference.dequantize(qweight, qzeros, scales)
    assert_bitexact(out, loop_oracle(qweight, qzeros, scales, G))


# --- signed zero, NaN and infinity ----------------------------------------


@pytest.mark.parametrize(
    "dtype, zero, negative_zero",
    [("float16", 0x0000, 0x8000), ("float32", 0x00000000, 0x80000000), ("bfloat16", 0, 0x8000)],
)
def test_q_equal_z_gives_zero_signed_like_the_scale(dtype, zero, negative_zero):
    # q = z = 5 everywhere: 0 * s is +0 for s > 0 and -0 for s < 0 (not q*s - z*s).
    qweight = words(0x55555555).reshape(1, 1)
    scales = np.array([[1.5, -1.5, 3.0, -3.0, 0.25, -0.25, 7.0, -7.0]], dtype=np.float32)
    out = reference.dequantize(qweight, qweight, scales, out_dtype=dtype)
    assert to_bits(out).tolist() == [[zero, negative_zero] * 4]


def test_nan_and_inf_scales():
    # Columns 0..7 read nibbles 0,4,1,5,2,6,3,7; qweight nibbles (low first)
    # 2,2,1,0,2,1,2,2 -> q by column: 2,2,2,1,1,2,0,2. All zeros are 1:
    #   q - z by column:               1,1,1,0,0,1,-1,1
    qweight = words(0x22120122).reshape(1, 1)
    qzeros = words(0x11111111).reshape(1, 1)
    inf, nan = np.inf, np.nan
    scales = np.array([[nan, inf, -inf, inf, nan, 2.0, inf, -0.0]], dtype=np.float16)
    out = reference.dequantize(qweight, qzeros, scales)
    # NaN * 1 = NaN; 1 * inf = inf; 1 * -inf = -inf; 0 * inf = NaN; 0 * NaN = NaN;
    # 1 * 2 = 2; -1 * inf = -inf; 1 * -0 = -0
    assert np.isnan(out[0, [0, 3, 4]]).all()
    assert to_bits(out[0, [1, 2, 5, 6, 7]]).tolist() == [0x7C00, 0xFC00, 0x4000, 0xFC00, 0x8000]


def test_nan_scale_stays_nan_in_bfloat16():
    qweight = words(0x11111111).reshape(1, 1)
    # NaNs whose payload lives in the low 16 bits, and the largest payloads:
    # rounded like numbers, 0x7FFFFFFF would carry out to -0 and 0xFFFFFFFF to +0.
    scales = f32(0x7F800001, 0xFF800001, 0x7FFFFFFF, 0xFFFFFFFF, 0, 0, 0, 0).reshape(1, 8)
    out = to_bits(reference.dequantize(qweight, np.zeros((1, 1), np.int32), scales,
                                       out_dtype="bfloat16"))
    is_nan = ((out & 0x7F80) == 0x7F80) & ((out & 0x007F) != 0)
    assert is_nan[0, :4].all()
    # the sign of a NaN is kept
    assert (out[0, :4] >> 15).tolist() == [0, 1, 0, 1]


# --- rounding to the output type ------------------------------------------
#
# With q - z = 1 the float32 product is the scale itself, so float32 scales
# with chosen bit patterns probe the final rounding directly.


def dequantize_ones(scale_bits, out_dtype):
    scales = f32(*scale_bits).reshape(1, 8)
    return reference.dequantize(
        words(0x11111111).reshape(1, 1), words(0).reshape(1, 1), scales, out_dtype=out_dtype
    )


BF16_CASES = [
    # (float32 bits, bfloat16 bits, why)
    (0x3F808000, 0x3F80, "1 + 2^-8: tie, kept part 0x3F80 even -> stays"),
    (0x3F818000, 0x3F82, "1 + 3*2^-8: tie, kept part 0x3F81 odd -> up to even"),
    (0x3F808001, 0x3F81, "just above the tie -> up"),
    (0x3F807FFF, 0x3F80, "just below the tie -> down"),
    (0xBF808000, 0xBF80, "negative tie -> even, sign kept"),
    (0x7F7FFFFF, 0x7F80, "largest float32 -> past the largest bfloat16 -> +inf"),
    (0x7F7F7FFF, 0x7F7F, "below the boundary -> largest finite bfloat16"),
    (0x00018000, 0x0002, "subnormal tie, 0x0001 odd -> 0x0002"),
]


def test_bfloat16_rounding_by_hand():
    out = dequantize_ones([bits for bits, _, _ in BF16_CASES], "bfloat16")
    for got, (_, want, why) in zip(to_bits(out)[0].tolist(), BF16_CASES):
        assert got == want, f"{why}: got 0x{got:04x}, want 0x{want:04x}"


def test_float16_rounding_by_hand():
    cases = [
        (0x3F801000, 0x3C00),  # 1 + 2^-11: tie between 1 and 1 + 2^-10 -> 1 (even)
        (0x3F803000, 0x3C02),  # 1 + 3*2^-11: tie, odd 0x3C01 -> 0x3C02
        (0x477FEFFF, 0x7BFF),  # just below 65520 -> 65504
        (0x477FF000, 0x7C00),  # 65520: tie between 65504 (odd) and 2^16 -> inf
        (0xFF800000, 0xFC00),  # -inf
        (0x33800000, 0x0001),  # 2^-24, the smallest subnormal
        (0x33000000, 0x0000),  # 2^-25: tie between 0 and 2^-24 -> 0 (even)
        (0x80000000, 0x8000),  # -0
    ]
    out = dequantize_ones([bits for bits, _ in cases], "float16")
    assert to_bits(out)[0].tolist() == [want for _, want in cases]


def test_bfloat16_rounding_matches_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(2)
    bits = rng.integers(0, 2**32, size=(64, 8), dtype=np.uint32)
    bits[:, 1] = (bits[:, 1] & 0xFFFF0000) | 0x8000  # force exact ties
    scales = bits.view(np.float32)
    scales = np.where(np.isnan(scales), np.float32(1.5), scales)
    qweight = words(*[0x11111111] * 64).reshape(64, 1)
    out = reference.dequantize(qweight, np.zeros((64, 1), np.int32), scales,
                               out_dtype=ml_dtypes.bfloat16)
    assert out.dtype == ml_dtypes.bfloat16
    assert_bitexact(out, scales.astype(ml_dtypes.bfloat16))


def test_bfloat16_scales_widen_exactly():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    # bfloat16 0x3F81 is 1 + 2^-7; 0xC2F7 is -123.5; q - z = 1 .. 8 by column
    # (qweight nibbles 1..8 read through REVERSE give q = 1,5,2,6,3,7,4,8).
    scales = np.array([[0x3F81, 0xC2F7] * 4], dtype=np.uint16).view(ml_dtypes.bfloat16)
    out = reference.dequantize(
        words(0x87654321).reshape(1, 1), words(0).reshape(1, 1), scales, out_dtype="float32"
    )
    s0, s1 = 1 + 2**-7, -123.5
    assert out[0].tolist() == [1 * s0, 5 * s1, 2 * s0, 6 * s1, 3 * s0, 7 * s1, 4 * s0, 8 * s1]
    # the same bits as uint16 (the no-ml_dtypes convention) give the same result
    assert_bitexact(
        reference.dequantize(words(0x87654321).reshape(1, 1), words(0).reshape(1, 1),
                             scales.view(np.uint16), out_dtype="float32"),
        out,
    )


# --- argument handling ----------------------------------------------------


def test_group_size_is_inferred_and_checked():
    qweight = np.zeros((8, 2), np.int32)
    qzeros = np.zeros((2, 2), np.int32)
    scales = np.ones((2, 16), np.float16)
    assert reference.dequantize(qweight, qzeros, scales).shape == (8, 16)
    per_channel = reference.dequantize(qweight, qzeros[:1], scales[:1], group_size=-1)
    assert_bitexact(per_channel, reference.dequantize(qweight, qzeros[:1], scales[:1]))
    with pytest.raises(ValueError, match="group_size"):
        reference.dequantize(qweight, qzeros, scales, group_size=3)
    with pytest.raises(ValueError, match="scales"):
        reference.dequantize(qweight, qzeros, scales, group_size=2)
    with pytest.raises(ValueError, match="qzeros"):
        reference.dequantize(qweight, np.zeros((2, 3), np.int32), scales)
    with pytest.raises(ValueError, match="columns"):
        reference.dequantize(qweight, qzeros, np.ones((2, 8), np.float16))
    with pytest.raises(TypeError, match="qweight"):
        reference.dequantize(qweight.astype(np.int64), qzeros, scales)
    with pytest.raises(TypeError, match="scales"):
        reference.dequantize(qweight, qzeros, scales.astype(np.float64))
    with pytest.raises(TypeError, match="out_dtype"):
        reference.dequantize(qweight, qzeros, scales, out_dtype="int8")


def test_zero_size():
    out = reference.dequantize(
        np.zeros((0, 2), np.int32), np.zeros((0, 2), np.int32), np.zeros((0, 16), np.float32)
    )
    assert out.shape == (0, 16) and out.dtype == np.float32
    out = reference.dequantize(
        np.zeros((4, 0), np.int32), np.zeros((1, 0), np.int32), np.zeros((1, 0), np.float16)
    )
    assert out.shape == (4, 0)


def test_torch_inputs_match_numpy_inputs():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    qweight = random_words(rng, (64, 4))
    qzeros = random_words(rng, (2, 4))
    scales = torch.randn(2, 32, dtype=torch.float32, generator=torch.Generator().manual_seed(0))
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        s = scales.to(dtype)
        got = reference.dequantize(torch.from_numpy(qweight), torch.from_numpy(qzeros), s,
                                   out_dtype=torch.float32)
        # bfloat16 -> float32 is exact in torch too: the same values through NumPy
        want = reference.dequantize(qweight, qzeros, s.float().numpy(), out_dtype="float32")
        assert_bitexact(got, want)
    # bfloat16 out against torch's own float32 -> bfloat16 rounding (a torch tensor
    # and a NumPy array compared by assert_bitexact)
    got = reference.dequantize(qweight, qzeros, scales, out_dtype=torch.bfloat16)
    want = reference.dequantize(qweight, qzeros, scales, out_dtype=torch.float32)
    assert_bitexact(torch.from_numpy(want).to(torch.bfloat16), got)


# --- assert_bitexact itself -----------------------------------------------


def test_assert_bitexact_accepts_any_nan_payload():
    a = f16(0x7E00, 0x3C00, 0xFE01)
    b = f16(0x7C01, 0x3C00, 0x7FFF)
    assert_bitexact(a, b)


@pytest.mark.parametrize(
    "actual, expected, message",
    [
        (f16(0x3C00, 0x0000), f16(0x3C00, 0x8000), r"1 of 2 .* index \(1,\).*0x0000.*0x8000"),
        (f16(0x7E00, 0x3C00), f16(0x3C00, 0x3C00), r"index \(0,\)"),
        (f32(1, 2, 3), f32(1, 2), "shape"),
        (f32(0x3F800000), f16(0x3C00), "dtype"),
    ],
)
def test_assert_bitexact_reports_mismatches(actual, expected, message):
    with pytest.raises(AssertionError, match=message):
        assert_bitexact(actual, expected)


def test_assert_bitexact_reports_first_index_and_count_in_2d():
    a = np.zeros((3, 4), np.float32)
    b = a.copy()
    b[1, 2] = 1.0
    b[2, 0] = 2.0
    with pytest.raises(AssertionError, match=r"2 of 12 .* \(1, 2\).*0x00000000.*0x3f800000"):
        assert_bitexact(a, b)
