"""quantize, pack and unpack (awq_fast_dequant.quant): the AWQ packing checked by hand
and against the NumPy reference, and the inputs each function refuses."""

import numpy as np
import pytest

from awq_fast_dequant import quant, reference

from conftest import WORKED_Q, WORKED_QWEIGHT, WORKED_QZEROS, WORKED_Z, words


# --- pack / unpack ---------------------------------------------------------


def test_pack_of_a_hand_written_row():
    # The q and z rows of the worked example, packed back into their words.
    assert quant.pack(np.array([WORKED_Q])).view(np.uint32).tolist() == [[WORKED_QWEIGHT]]
    assert quant.pack(np.array([WORKED_Z], np.uint8)).tolist() == [[WORKED_QZEROS]]
    # nested lists of numbers are read like the array they spell
    assert quant.pack([list(WORKED_Q)]).view(np.uint32).tolist() == [[WORKED_QWEIGHT]]


def test_unpack_of_a_hand_written_word():
    assert quant.unpack(words(WORKED_QWEIGHT).reshape(1, 1)).tolist() == [list(WORKED_Q)]


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.int64])
def test_pack_unpack_round_trip(dtype):
    rng = np.random.default_rng(4)
    values = rng.integers(0, 16, size=(37, 96)).astype(dtype)
    packed = quant.pack(values)
    assert packed.dtype == np.int32 and packed.shape == (37, 12)
    unpacked = quant.unpack(packed)
    assert unpacked.dtype == np.uint8
    np.testing.assert_array_equal(unpacked, values)
    np.testing.assert_array_equal(quant.pack(unpacked), packed)
    np.testing.assert_array_equal(quant.unpack(packed.view(np.uint32)), values)


def test_pack_rejects_bad_input():
    with pytest.raises(ValueError, match=r"0\.\.15.*16 at index \(1, 3\)"):
        quant.pack(np.array([[0] * 8, [0, 0, 0, 16, 0, 0, 0, 0]]))
    with pytest.raises(ValueError, match="0..15"):
        quant.pack(np.full((1, 8), -1))
    with pytest.raises(ValueError, match="multiple of 8"):
        quant.pack(np.zeros((2, 12), np.uint8))
    with pytest.raises(ValueError, match="2-D"):
        quant.pack(np.zeros(8, np.uint8))
    with pytest.raises(TypeError, match="integer"):
        quant.pack(np.zeros((2, 8), np.float32))
    with pytest.raises(TypeError, match="int32 or uint32"):
        quant.unpack(np.zeros((2, 1), np.int64))


def test_pack_unpack_torch_round_trip():
    torch = pytest.importorskip("torch")
    values = torch.randint(0, 16, (4, 16), generator=torch.Generator().manual_seed(5))
    packed = quant.pack(values)
    assert isinstance(packed, torch.Tensor) and packed.dtype == torch.int32
    assert torch.equal(quant.unpack(packed).long(), values)


# --- quantize -------------------------------------------------------------


def check_round_trip(weight, qweight, qzeros, scales, G):
    """|w - dequantized| <= scale / 2, plus the rounding of the output type."""
    deq = reference.dequantize(qweight, qzeros, scales, group_size=G, out_dtype="float32")
    step = reference.dequantize(
        np.full_like(qweight, 0x11111111), np.zeros_like(qzeros), scales, group_size=G,
        out_dtype="float32",
    )  # the scale of every element, broadcast to [K, N]
    assert (step > 0).all() and np.isfinite(step).all()
    error = np.abs(weight.astype(np.float64) - deq.astype(np.float64))
    # The round trip goes through float32 (w / scale, then (q - z) * scale):
    # allow a few float32 roundings of the largest value in the group.
    bound = step / 2 * (1 + 2**-16) + 16 * np.spacing(np.float32(1)) * step
    worst = np.unravel_index(np.argmax(error - bound), error.shape)
    assert (error <= bound).all(), (
        f"at {worst}: w={weight[worst]!r} deq={deq[worst]!r} scale={step[worst]!r}"
    )
    return deq


@pytest.mark.parametrize("G", [32, 128, 256])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_quantize_round_trip_within_half_a_step(G, dtype):
    rng = np.random.default_rng(6)
    K, N = 256, 72  # G = 256 is per channel
    weight = (rng.standard_normal((K, N)) * 0.05).astype(dtype)
    qweight, qzeros, scales = quant.quantize(weight, group_size=G)
    assert qweight.dtype == np.int32 and qweight.shape == (K, N // 8)
    assert qzeros.dtype == np.int32 and qzeros.shape == (K // G, N // 8)
    assert scales.shape == (K // G, N)
    assert scales.dtype == (np.float16 if dtype == np.float64 else dtype)
    deq = check_round_trip(weight, qweight, qzeros, scales, G)
    # and the result uses the 4-bit range: it is not trivially all zeros
    assert np.abs(deq).max() > 0.1


def test_quantize_float16_output_also_within_half_a_step():
    rng = np.random.default_rng(7)
    weight = (rng.standard_normal((64, 16)) * 0.05).astype(np.float16)
    qweight, qzeros, scales = quant.quantize(weight, group_size=32)
    deq = reference.dequantize(qweight, qzeros, scales).astype(np.float64)
    step = np.repeat(scales.astype(np.float64), 32, axis=0)
    # float16 output adds at most half a float16 step at the value
    bound = step / 2 * (1 + 2**-16) + np.spacing(np.abs(deq).astype(np.float16)) / 2
    assert (np.abs(weight - deq) <= bound).all()


def test_quantize_edge_groups():
    # Column 0: a constant positive group; 1: all zeros; 2: all positive;
    # 3: all negative; 4: one huge outlier; 5: tiny values (width / 15
    # underflows in float16); 6, 7: ordinary.
    K = 32
    rng = np.random.default_rng(8)
    weight = rng.standard_normal((K, 8)).astype(np.float32)
    weight[:, 0] = 0.75
    weight[:, 1] = 0.0
    weight[:, 2] = rng.uniform(1.0, 1.1, K)
    weight[:, 3] = -rng.uniform(2.0, 3.0, K)
    weight[5, 4] = 300.0
    weight[:, 5] = rng.uniform(-1e-9, 1e-9, K)
    for dtype in (np.float32, np.float16):
        w = weight.astype(dtype)
        qweight, qzeros, scales = quant.quantize(w, group_size=16)
        assert (scales.astype(np.float32) > 0).all()
        check_round_trip(w, qweight, qzeros, scales, 16)
    # the all-zero group dequantizes to exact zeros
    qweight, qzeros, scales = quant.quantize(weight, group_size=16)
    assert (reference.dequantize(qweight, qzeros, scales)[:, 1] == 0).all()


def test_quantize_bfloat16_numpy():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(9)
    weight = rng.standard_normal((64, 32)).astype(ml_dtypes.bfloat16)
    qweight, qzeros, scales = quant.quantize(weight, group_size=32)
    assert scales.dtype == ml_dtypes.bfloat16
    check_round_trip(weight.astype(np.float32), qweight, qzeros, scales, 32)


def test_quantize_per_channel_spellings_agree():
    rng = np.random.default_rng(10)
    weight = rng.standard_normal((48, 8)).astype(np.float16)
    a = quant.quantize(weight, group_size=-1)
    b = quant.quantize(weight, group_size=None)
    c = quant.quantize(weight, group_size=48)
    for x, y, z in zip(a, b, c):
        np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(x, z)
    assert a[2].shape == (1, 8)


def test_quantize_is_independent_of_row_blocks(monkeypatch):
    rng = np.random.default_rng(11)
    weight = rng.standard_normal((96, 16)).astype(np.float32)
    whole = quant.quantize(weight, group_size=32)
    for block_elems in (16, 16 * 5, 16 * 48):  # 1 row, 5 rows (across groups), 48 rows
        monkeypatch.setattr(quant, "_BLOCK_ELEMS", block_elems)
        for x, y in zip(quant.quantize(weight, group_size=32), whole):
            np.testing.assert_array_equal(x, y)


def test_quantize_rejects_bad_input():
    weight = np.zeros((96, 16), np.float16)
    with pytest.raises(ValueError, match="group_size"):
        quant.quantize(weight, group_size=64)
    with pytest.raises(ValueError, match="group_size"):
        quant.quantize(weight, group_size=0)
    with pytest.raises(ValueError, match="multiple of 8"):
        quant.quantize(np.zeros((96, 12), np.float16), group_size=32)
    with pytest.raises(TypeError, match="weight"):
        quant.quantize(np.zeros((96, 16), np.int32), group_size=32)
    bad = weight.copy()
    bad[3, 3] = np.nan
    with pytest.raises(ValueError, match="finite"):
        quant.quantize(bad, group_size=32)
    with pytest.raises(ValueError, match="too wide"):
        # float64 weights get float16 scales, and 2e6 / 15 is beyond 65504
        quant.quantize(np.array([[-1e6] * 8, [1e6] * 8]), group_size=2)


def test_quantize_torch_returns_torch():
    torch = pytest.importorskip("torch")
    weight = torch.randn(64, 16, generator=torch.Generator().manual_seed(12))
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        qweight, qzeros, scales = quant.quantize(weight.to(dtype), group_size=32)
        assert qweight.dtype == torch.int32 and qzeros.dtype == torch.int32
        assert scales.dtype == (torch.float16 if dtype == torch.float64 else dtype)
        assert scales.shape == (2, 16)
        check_round_trip(weight.to(dtype).float().numpy(), qweight.numpy(), qzeros.numpy(),
                         scales, 32)



# --- inputs every function refuses the same way ----------------------------

# (function, the name its errors give the argument, a valid 2-D input of 8 columns)
FUNCTIONS = [
    (quant.pack, "intweights", np.zeros((2, 8), np.int32)),
    (quant.unpack, "qweight", np.zeros((2, 8), np.int32)),
    (lambda w: quant.quantize(w, group_size=2), "weight", np.zeros((2, 8), np.float32)),
]
FUNCTION_IDS = ["pack", "unpack", "quantize"]


@pytest.mark.parametrize("fn,name,valid", FUNCTIONS, ids=FUNCTION_IDS)
def test_non_native_byte_order_is_refused_like_dequantize(fn, name, valid):
    fn(valid)  # the same array in native byte order is fine
    swapped = valid.astype(valid.dtype.newbyteorder("S"))
    before = swapped.copy()
    with pytest.raises(TypeError, match=rf"^{name} has non-native byte order; convert it with "
                                        r"arr\.astype\(arr\.dtype\.newbyteorder\('='\)\)$"):
        fn(swapped)
    assert np.array_equal(swapped, before)


@pytest.mark.parametrize("fn,name,valid", FUNCTIONS, ids=FUNCTION_IDS)
@pytest.mark.parametrize("unreadable", [None, object(), [[1, 2], [3]]],
                         ids=["None", "object", "ragged list"])
def test_what_numpy_cannot_read_is_a_type_error(fn, name, valid, unreadable):
    with pytest.raises(TypeError, match=f"^{name} must be "):
        fn(unreadable)


@pytest.mark.parametrize("fn,name,valid", FUNCTIONS, ids=FUNCTION_IDS)
def test_meta_tensor_is_a_type_error(fn, name, valid):
    torch = pytest.importorskip("torch")
    meta = torch.from_numpy(valid).to("meta")
    with pytest.raises(TypeError, match=f"^{name} is a meta tensor"):
        fn(meta)


@pytest.mark.parametrize("fn,name,valid", FUNCTIONS, ids=FUNCTION_IDS)
def test_sparse_tensor_is_a_type_error(fn, name, valid):
    torch = pytest.importorskip("torch")
    sparse = torch.from_numpy(valid).to_sparse()
    with pytest.raises(TypeError, match=rf"^{name} must be a dense \(strided\) tensor.*to_dense"):
        fn(sparse)


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "bfloat16", "complex64"])
@pytest.mark.parametrize("fn,name", [(quant.pack, "intweights"), (quant.unpack, "qweight")],
                         ids=["pack", "unpack"])
def test_torch_types_that_are_not_words(fn, name, dtype):
    """Types NumPy lacks (float8, bfloat16) or that hold no integers are refused by
    name, not by NumPy's or torch's own error."""
    torch = pytest.importorskip("torch")
    t = torch.zeros((2, 8)).to(getattr(torch, dtype))
    with pytest.raises(TypeError, match=f"^{name} must be .*; got {dtype}$"):
        fn(t)


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "complex64"])
def test_torch_types_that_are_not_weights(dtype):
    torch = pytest.importorskip("torch")
    t = torch.zeros((2, 8)).to(getattr(torch, dtype))
    with pytest.raises(TypeError, match="^weight must be float16, bfloat16, float32 or float64; "
                                        f"got {dtype}$"):
        quant.quantize(t, group_size=2)


def test_quantize_reads_a_lazily_negated_tensor():
    """.imag of a conjugated view is a tensor with torch's negative bit set, which
    .numpy() refuses; quantize reads its values."""
    torch = pytest.importorskip("torch")
    z = torch.randn(64, 16, dtype=torch.complex64, generator=torch.Generator().manual_seed(13))
    lazy = z.conj().imag
    assert lazy.is_neg()
    for got, want in zip(quant.quantize(lazy, group_size=32),
                         quant.quantize(-z.imag.clone(), group_size=32)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("group_size", [32.0, True, "32"])
def test_group_size_must_be_an_int(group_size):
    with pytest.raises(TypeError, match=f"^group_size must be an int .*got "
                                        f"{type(group_size).__name__}$"):
        quant.quantize(np.zeros((64, 8), np.float32), group_size=group_size)


def test_group_size_takes_numpy_integers():
    weight = np.random.default_rng(14).standard_normal((64, 8)).astype(np.float32)
    for x, y in zip(quant.quantize(weight, group_size=np.int64(32)),
                    quant.quantize(weight, group_size=32)):
        np.testing.assert_array_equal(x, y)
