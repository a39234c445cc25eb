"""quantize, pack and unpack (awq_fast_dequant.quant): the AWQ packing checked by hand
and against the NumPy reference, and the inputs each function refuses."""

import numpy as np
import pytest

from awq_fast_dequant import quant, reference

from conftest import WORKED_Q, WORKED_QWEIGHT, WORKED_QZEROS, WORKED_Z, np_dtype, words


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



# --- quantize with a hessian (GPTQ rounding) --------------------------------


def correlated_inputs(rng, T, K):
    """T inputs of K features whose energy sits in a few shared directions, as the
    inputs of a trained layer's do."""
    mix = np.eye(K) + rng.standard_normal((K, K)) / np.sqrt(K)
    loud = 4 * rng.standard_normal((8, K))
    return rng.standard_normal((T, K)) @ mix + rng.standard_normal((T, 8)) @ loud


def dequantized(result, G):
    return reference.dequantize(*result, group_size=G, out_dtype="float32").astype(np.float64)


def plain_gptq(w, G, H, damp, act_order=False):
    """q [K, N] of GPTQ written as the paper states it: float64, one row at a time,
    each row's error fed into every later row at once, U the upper Cholesky factor
    of the inverse of the damped H. Each group's min-max grid is taken when the
    group starts, or, with act_order, from the weights as given, and the rows go in
    order of decreasing diagonal of H."""
    K, N = w.shape
    order = np.argsort(-np.diag(H), kind="stable") if act_order else np.arange(K)
    H = H[np.ix_(order, order)] + damp * np.mean(np.diag(H)) * np.eye(K)
    U = np.linalg.cholesky(np.linalg.inv(H)).T
    W = w.astype(np.float64)

    def min_max_grid(rows):
        rows = rows.astype(np.float32)
        lo = np.minimum(rows.min(axis=0), 0)[None]
        hi = np.maximum(rows.max(axis=0), 0)[None]
        return tuple(a[0].astype(np.float64) for a in quant._grid(lo, hi, "float32")[1:])

    grids = [min_max_grid(W[g0:g0 + G]) for g0 in range(0, K, G)] if act_order else None
    W = W[order]
    q = np.empty((K, N))
    for k in range(K):
        if not act_order and k % G == 0:
            grids = {k // G: min_max_grid(W[k:k + G])}
        step, zero = grids[order[k] // G]
        q[order[k]] = np.clip(np.rint(W[k] / step) + zero, 0, 15)
        error = (W[k] - (q[order[k]] - zero) * step) / U[k, k]
        W[k + 1:] -= np.outer(U[k, k + 1:], error)
    return q


@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("G", [32, 128, None])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_gptq_with_a_diagonal_hessian_is_min_max(G, dtype, act_order):
    """A diagonal X^T X couples no two rows, so no error is fed anywhere: every
    group keeps the grid of its original values and every value is rounded to
    nearest, which with min-max grids is min-max rounding, bit for bit, in either
    order (inputs that are always zero, damping or none), before any refinement."""
    rng = np.random.default_rng(20)
    K, N = 256, 24
    weight = (rng.standard_normal((K, N)) * 0.05).astype(np_dtype(dtype))
    diagonal = rng.uniform(0, 3, K)
    diagonal[::7] = 0
    want = quant.quantize(weight, group_size=G)
    for hessian, damp in ((np.eye(K), 0.01), (np.diag(diagonal), 0.01), (np.diag(diagonal), 0)):
        got = quant.quantize(weight, group_size=G, hessian=hessian, damp=damp, grid="minmax",
                             act_order=act_order, refine=0)
        for x, y in zip(got, want):
            assert x.dtype == y.dtype
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("act_order, first", [(False, 0), (True, 1)])
def test_gptq_feeds_the_first_rows_error_into_the_other(act_order, first):
    """K = 2, one group, H11 > H00: the first row -- row 0 in row order, row 1
    (the larger diagonal) with act_order -- is rounded to nearest on the min-max
    grid, taken before either row; the other row o is then rounded from
    w_o + (H01 / H_oo) * (w_first - deq_first), the value that minimizes
    ||X (w - deq)|| with the first row fixed."""
    rng = np.random.default_rng(21)
    weight = rng.standard_normal((2, 64)).astype(np.float32)
    H = np.array([[1.0, 0.9], [0.9, 2.0]])
    _, qzeros, scales = quant.quantize(weight, group_size=2)
    step, zero = scales[0].astype(np.float64), quant.unpack(qzeros)[0].astype(np.float64)
    other = 1 - first
    q = np.empty((2, 64))
    q[first] = np.clip(np.rint(weight[first] / step) + zero, 0, 15)
    target = weight[other] + 0.9 / H[other, other] * (weight[first] - (q[first] - zero) * step)
    q[other] = np.clip(np.rint(target / step) + zero, 0, 15)

    qweight, got_zeros, got_scales = quant.quantize(weight, group_size=2, hessian=H, damp=0,
                                                    grid="minmax", act_order=act_order,
                                                    refine=0)
    np.testing.assert_array_equal(got_zeros, qzeros)  # the group starts before any error
    np.testing.assert_array_equal(got_scales, scales)
    np.testing.assert_array_equal(quant.unpack(qweight), q)
    nearest = np.clip(np.rint(weight[other] / step) + zero, 0, 15)
    assert (q[other] != nearest).any()  # the feedback acted


@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("G", [32, 128, 384])
def test_gptq_blocks_agree_with_the_row_by_row_algorithm(G, act_order):
    """The lazy block updates (in row order: groups of 32 in blocks of one group,
    G = 384 in blocks of 128; in act order: blocks of 128 across groups) give the
    values of the plain algorithm, up to the rare value whose float32 and float64
    errors fall on either side of a rounding boundary."""
    rng = np.random.default_rng(22)
    K, N = 384, 48
    X = correlated_inputs(rng, 1024, K)
    weight = (rng.standard_normal((K, N)) * 0.05).astype(np.float32)
    H = X.T @ X
    got = quant.quantize(weight, group_size=G, hessian=H, grid="minmax", act_order=act_order,
                         refine=0)
    want = plain_gptq(weight, G, H, 0.01, act_order)
    assert (quant.unpack(got[0]) == want).mean() > 0.99
    error = np.linalg.norm(X @ (weight - dequantized(got, G)))
    zeros = np.repeat(quant.unpack(got[1]), G, axis=0)
    steps = np.repeat(got[2].astype(np.float64), G, axis=0)
    want_error = np.linalg.norm(X @ (weight - (want - zeros) * steps))
    assert abs(error / want_error - 1) < 0.02


@pytest.mark.parametrize("G", [32, 128, 256])
def test_gptq_reduces_the_output_error_of_min_max(G):
    """||X W - X W_q|| falls well below min-max's, on the inputs H came from and on
    other inputs of the same distribution."""
    rng = np.random.default_rng(23)
    K, N = 256, 64
    X, X_new = np.split(correlated_inputs(rng, 4096, K), 2)
    weight = (rng.standard_normal((K, N)) * 0.05).astype(np.float32)
    min_max = weight - dequantized(quant.quantize(weight, group_size=G), G)
    gptq = weight - dequantized(quant.quantize(weight, group_size=G, hessian=X.T @ X), G)
    assert np.linalg.norm(X @ gptq) < 0.75 * np.linalg.norm(X @ min_max)
    assert np.linalg.norm(X_new @ gptq) < 0.8 * np.linalg.norm(X_new @ min_max)


def test_gptq_grids_stay_in_range_under_strong_feedback():
    """Nearly collinear inputs feed large errors forward, past the range of the
    original weights; every group still gets a positive finite scale (float16,
    rounded up as min-max's) and a zero point in 0..15, the first group the
    min-max grid (no error reaches it before it starts), and edge groups (zero,
    constant, one-signed, tiny) give finite values."""
    rng = np.random.default_rng(25)
    K, N, G = 128, 16, 32
    base = rng.standard_normal((4096, 4))
    X = base @ rng.standard_normal((4, K)) + 1e-3 * rng.standard_normal((4096, K))
    weight = rng.standard_normal((K, N)).astype(np.float16)
    weight[:, 0] = 0
    weight[:, 1] = 0.75
    weight[:, 2] = rng.uniform(1.0, 1.1, K)
    weight[:, 3] = -rng.uniform(2.0, 3.0, K)
    weight[:, 4] = rng.uniform(-1e-6, 1e-6, K)
    qweight, qzeros, scales = quant.quantize(weight, group_size=G, hessian=X.T @ X,
                                             grid="minmax", act_order=False, refine=0)
    assert scales.dtype == np.float16 and scales.shape == (K // G, N)
    assert np.isfinite(scales).all() and (scales > 0).all()
    zeros = quant.unpack(qzeros)
    assert zeros.max() <= 15
    _, min_max_zeros, min_max_scales = quant.quantize(weight[:G], group_size=G)
    np.testing.assert_array_equal(qzeros[0], min_max_zeros[0])
    np.testing.assert_array_equal(scales[0], min_max_scales[0])
    deq = dequantized((qweight, qzeros, scales), G)
    assert np.isfinite(deq).all()
    assert (deq[:G, 0] == 0).all()  # the first all-zero group, before any feedback
    # the feedback moved values beyond min-max's grid in later groups
    later = np.repeat(scales[1:].astype(np.float64), G, axis=0)
    assert (np.abs(weight[G:] - deq[G:]) > later / 2 * 1.001).any()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_gptq_returns_what_min_max_returns(dtype):
    rng = np.random.default_rng(26)
    K, N, G = 64, 16, 32
    X = correlated_inputs(rng, 256, K)
    weight = (rng.standard_normal((K, N)) * 0.05).astype(np_dtype(dtype))
    for hessian in (X.T @ X, (X.T @ X).astype(np.float32)):
        for got, want in zip(quant.quantize(weight, group_size=G, hessian=hessian),
                             quant.quantize(weight, group_size=G)):
            assert type(got) is type(want)
            assert got.dtype == want.dtype and got.shape == want.shape


def test_gptq_torch_in_torch_out():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(27)
    X = correlated_inputs(rng, 256, 64)
    H = X.T @ X
    weight = torch.from_numpy((rng.standard_normal((64, 16)) * 0.05).astype(np.float32))
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        got = quant.quantize(weight.to(dtype), group_size=32, hessian=torch.from_numpy(H))
        want = quant.quantize(weight.to(dtype), group_size=32)
        for g, w in zip(got, want):
            assert isinstance(g, torch.Tensor) and g.dtype == w.dtype and g.shape == w.shape
        # a tensor hessian is read like the NumPy array
        from_numpy = quant.quantize(weight.to(dtype), group_size=32, hessian=H)
        for g, n in zip(got, from_numpy):
            assert torch.equal(g, n)


def test_gptq_rejects_bad_hessians_and_damping_and_writes_nothing():
    rng = np.random.default_rng(28)
    K = 64
    weight = rng.standard_normal((K, 8)).astype(np.float32)
    X = correlated_inputs(rng, 256, K)
    H = X.T @ X
    before_w, before_h = weight.copy(), H.copy()
    with pytest.raises(ValueError, match=r"^hessian must have shape \[K, K\] = \[64, 64\]"):
        quant.quantize(weight, group_size=32, hessian=H[:32, :32])
    with pytest.raises(ValueError, match="^hessian must be 2-D"):
        quant.quantize(weight, group_size=32, hessian=np.ones(K))
    with pytest.raises(TypeError, match="^hessian must be a float16, bfloat16, float32 or "
                                        "float64 array; got int64"):
        quant.quantize(weight, group_size=32, hessian=np.eye(K, dtype=np.int64))
    bad = H.copy()
    bad[3, 5] = bad[5, 3] = np.nan
    with pytest.raises(ValueError, match="^hessian must be finite"):
        quant.quantize(weight, group_size=32, hessian=bad)
    bad = H.copy()
    bad[7, 7] = -1
    with pytest.raises(ValueError, match=r"diagonal is >= 0; got -1.0 at \[7, 7\]"):
        quant.quantize(weight, group_size=32, hessian=bad)
    bad = H.copy()
    bad[0, 1] += 0.1 * H[0, 0]
    with pytest.raises(ValueError, match="^hessian must be symmetric"):
        quant.quantize(weight, group_size=32, hessian=bad)
    indefinite = np.eye(K)
    indefinite[0, 1] = indefinite[1, 0] = 2  # [[1, 2], [2, 1]] has the eigenvalue -1
    with pytest.raises(ValueError, match="not positive definite .*damp=0.0"):
        quant.quantize(weight, group_size=32, hessian=indefinite, damp=0)
    zero_diagonal = np.eye(K)
    zero_diagonal[1, 1], zero_diagonal[0, 1], zero_diagonal[1, 0] = 0, 0.5, 0.5
    with pytest.raises(ValueError, match=r"\[1, 1\] is 0 but row 1 is not"):
        quant.quantize(weight, group_size=32, hessian=zero_diagonal)
    for damp in (-0.01, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=f"^damp must be a finite number >= 0; got {damp}"):
            quant.quantize(weight, group_size=32, hessian=H, damp=damp)
    for damp in ("0.01", True, None):
        with pytest.raises(TypeError, match=f"^damp must be a real number >= 0; got "
                                            f"{type(damp).__name__}"):
            quant.quantize(weight, group_size=32, hessian=H, damp=damp)
    nan_weight = weight.copy()
    nan_weight[2, 2] = np.nan
    with pytest.raises(ValueError, match="^weight must be finite"):
        quant.quantize(nan_weight, group_size=32, hessian=H)
    np.testing.assert_array_equal(weight, before_w)
    np.testing.assert_array_equal(H, before_h)
    quant.quantize(weight, group_size=32, hessian=H)  # a good call writes nothing either
    np.testing.assert_array_equal(weight, before_w)
    np.testing.assert_array_equal(H, before_h)


def test_gptq_of_an_all_zero_hessian_is_min_max():
    """A layer that saw only zeros (or nothing) has every input dead: no rounding
    error costs anything, so the mse search keeps the min-max grid as well."""
    weight = np.random.default_rng(29).standard_normal((64, 8)).astype(np.float32)
    for got, want in zip(quant.quantize(weight, group_size=32, hessian=np.zeros((64, 64))),
                         quant.quantize(weight, group_size=32)):
        np.testing.assert_array_equal(got, want)


# --- refine: coordinate descent and least-squares scales after GPTQ ---------------


def gptq_loss(weight, result, G, H, damp=0.01):
    """tr((w - W_q)^T H_d (w - W_q)), H_d = H + damp * mean(diag H) * I, float64."""
    damped = H + damp * np.mean(np.diag(H)) * np.eye(len(H))
    delta = weight.astype(np.float64) - dequantized(result, G)
    return float(np.einsum("kn,kn->", delta, damped @ delta))


@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("G", [32, 128, None])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_refine_lowers_gptqs_loss_round_by_round(G, dtype, act_order):
    """Each round of refine lowers the loss GPTQ minimizes, or keeps it (up to the
    float32 rounding of its sums). In row order, where loud inputs rounded late leave
    errors that the rows rounded before them could have absorbed, the first round cuts
    it by more than a third; in act order, which rounds the loud inputs first, the
    rounds gain less."""
    rng = np.random.default_rng(40)
    K, N = 256, 48
    X = correlated_inputs(rng, 1024, K) * rng.uniform(0.2, 3, K)
    H = X.T @ X
    weight = (rng.standard_normal((K, N)) * 0.05).astype(np_dtype(dtype))
    losses = [gptq_loss(weight, quant.quantize(weight, group_size=G, hessian=H,
                                               act_order=act_order, refine=rounds), G or K, H)
              for rounds in range(4)]
    assert all(b <= a * (1 + 1e-5) for a, b in zip(losses, losses[1:])), losses
    assert losses[1] < (0.999 if act_order else 0.65) * losses[0], losses
    # the default is two rounds
    for got, want in zip(quant.quantize(weight, group_size=G, hessian=H, act_order=act_order),
                         quant.quantize(weight, group_size=G, hessian=H, act_order=act_order,
                                        refine=2)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_refine_with_a_diagonal_hessian_fits_each_groups_scale(dtype):
    """No row is coupled to another, so the pass over the rows keeps min-max's codes
    (each row's best value is its weight); each group's scale becomes the least-squares
    sum d a w / sum d a^2 (a = q - zero, d the diagonal), rounded to nearest in the
    scales' type, in every column whose loss that lowers, and zero points stay.
    Inputs that are always zero cost nothing and weigh nothing in the fit."""
    rng = np.random.default_rng(41)
    K, N, G = 128, 32, 32
    weight = (rng.standard_normal((K, N)) * 0.05).astype(np_dtype(dtype))
    d = rng.uniform(0.5, 3, K)
    d[::7] = 0
    min_max = quant.quantize(weight, group_size=G)
    got = quant.quantize(weight, group_size=G, hessian=np.diag(d), damp=0, grid="minmax",
                         refine=1)
    np.testing.assert_array_equal(got[0], min_max[0])
    np.testing.assert_array_equal(got[1], min_max[1])
    a = (quant.unpack(min_max[0]).astype(np.float64)
         - np.repeat(quant.unpack(min_max[1]), G, axis=0))
    w = weight.astype(np.float64)
    fit = ((d[:, None] * a * w).reshape(-1, G, N).sum(axis=1)
           / (d[:, None] * a * a).reshape(-1, G, N).sum(axis=1))
    fit = fit.astype(np.float32).astype(np_dtype(dtype))  # to nearest

    def column_loss(scales):
        steps = np.repeat(scales.astype(np.float64), G, axis=0)
        return (d[:, None] * (w - a * steps) ** 2).sum(axis=0)

    better = column_loss(fit) < column_loss(min_max[2])
    assert better.mean() > 0.9
    want = np.where(better, fit, min_max[2])
    if dtype == "float16":
        np.testing.assert_array_equal(got[2], want)
    else:  # float32 scales keep the last bits of quantize's float32 sums
        np.testing.assert_allclose(got[2], want, rtol=1e-5)


def test_refine_is_checked_before_any_work():
    weight = np.zeros((64, 8), np.float32)
    H = np.eye(64)
    with pytest.raises(ValueError, match="^refine must be >= 0; got -1$"):
        quant.quantize(weight, group_size=32, hessian=H, refine=-1)
    for refine in (1.0, True, "2"):
        with pytest.raises(TypeError, match=f"^refine must be an int >= 0 .*got "
                                            f"{type(refine).__name__}$"):
            quant.quantize(weight, group_size=32, hessian=H, refine=refine)
    with pytest.raises(ValueError, match="^refine > 0 needs a hessian"):
        quant.quantize(weight, group_size=32, refine=1)
    quant.quantize(weight, group_size=32, refine=0)  # accepted, and ignored
    quant.quantize(weight, group_size=32, hessian=H, refine=np.int64(1))


# --- grid="mse" ------------------------------------------------------------------


def edge_weight(rng, K, N, dtype):
    """Gaussian weights with edge columns: all zero, constant, one-signed, a large
    outlier, tiny values, heavy tails."""
    weight = rng.standard_normal((K, N)) * 0.05
    weight[:, 0] = 0
    weight[:, 1] = 0.75
    weight[:, 2] = rng.uniform(1.0, 1.1, K)
    weight[:, 3] = -rng.uniform(2.0, 3.0, K)
    weight[5, 4] = 3.0
    weight[:, 5] = rng.uniform(-1e-6, 1e-6, K)
    weight[:, 6] = rng.standard_t(2, K) * 0.05
    return weight.astype(np_dtype(dtype))


def group_errors(weight, result, G, d=None):
    """Sum over each group of d_k (w - deq)^2, [K/G, N], float64."""
    error = (weight.astype(np.float64) - dequantized(result, G)) ** 2
    if d is not None:
        error *= np.asarray(d, np.float64)[:, None]
    return error.reshape(-1, G, error.shape[1]).sum(axis=1)


@pytest.mark.parametrize("G", [32, 128])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_mse_grid_never_has_a_larger_error_than_min_max(G, dtype):
    """The min-max grid is the first the search tries and only a strictly smaller
    error replaces it: no group and column is worse (up to the float32 rounding of
    the error sums), and Gaussian groups are better by a wide margin. Without a
    hessian the errors are plain; with a diagonal one (damp 0, some inputs always
    zero) each row's error is weighted by its diagonal entry."""
    rng = np.random.default_rng(30)
    K, N = 256, 64
    weight = edge_weight(rng, K, N, dtype)
    d = rng.uniform(0, 3, K)
    d[::9] = 0
    for hessian, weights in ((None, None), (np.diag(d), d)):
        refine = None if hessian is None else 0
        min_max = quant.quantize(weight, group_size=G, hessian=hessian, damp=0, grid="minmax",
                                 refine=refine)
        mse = quant.quantize(weight, group_size=G, hessian=hessian, damp=0, grid="mse",
                             refine=refine)
        want, got = group_errors(weight, min_max, G, weights), group_errors(weight, mse, G, weights)
        assert (got <= want * (1 + 1e-5) + 1e-30).all()
        assert got[:, 7:].sum() < 0.95 * want[:, 7:].sum()  # the Gaussian columns
        zeros = quant.unpack(mse[1])
        assert zeros.max() <= 15 and (mse[2].astype(np.float32) > 0).all()
        assert (dequantized(mse, G)[:, 0] == 0).all()  # an all-zero group stays exact


def mse_grid_as_documented(weight, G, d):
    """(scales, zeros) [K/G, N] of the "mse" search, one group and column at a time,
    as quantize's docstring states it, with float64 errors (float32 weights and
    scales, so float32 scales are the steps themselves)."""
    K, N = weight.shape
    scales, zeros = np.empty((K // G, N)), np.empty((K // G, N))
    for g in range(K // G):
        for n in range(N):
            v = weight[g * G:(g + 1) * G, n].astype(np.float32)
            lo, hi = np.float32(min(v.min(), 0)), np.float32(max(v.max(), 0))

            def error(p, shift=0):
                _, step, zero = quant._grid(np.float32(p) * lo[None], np.float32(p) * hi[None],
                                            "float32")
                step, zero = float(step[0]), float(np.clip(zero[0] + shift, 0, 15))
                q = np.clip(np.rint(v / np.float32(step)) + zero, 0, 15)
                return float((d[g * G:(g + 1) * G] * ((q - zero) * step - v) ** 2).sum()), step, zero

            best = (*error(1.0), 1.0)
            for p in [1 - 0.05 * i for i in range(1, 11)]:
                e = error(p)
                if e[0] < best[0]:
                    best = (*e, np.float32(p))
            for delta in (0.025, 0.0125, 0.00625):
                center = best[3]
                for sign in (-1, 1):
                    p = min(np.float32(center) + np.float32(sign * delta), np.float32(1))
                    e = error(p)
                    if e[0] < best[0]:
                        best = (*e, p)
            for shift in (-1, 1):
                e = error(best[3], shift)
                if e[0] < best[0]:
                    best = (*e, best[3])
            scales[g, n], zeros[g, n] = best[1], best[2]
    return scales, zeros


def test_mse_grid_is_the_documented_search():
    rng = np.random.default_rng(31)
    K, N, G = 64, 16, 32
    weight = edge_weight(rng, K, N, "float32")
    d = rng.uniform(0.5, 2, K)
    for hessian, weights in ((None, np.ones(K)), (np.diag(d), d)):
        _, qzeros, scales = quant.quantize(weight, group_size=G, hessian=hessian, damp=0,
                                           grid="mse", refine=None if hessian is None else 0)
        want_scales, want_zeros = mse_grid_as_documented(weight, G, weights / weights.max())
        np.testing.assert_array_equal(scales, want_scales)
        np.testing.assert_array_equal(quant.unpack(qzeros), want_zeros)


def test_mse_grid_is_independent_of_blocks_and_deterministic(monkeypatch):
    rng = np.random.default_rng(32)
    weight = rng.standard_normal((96, 16)).astype(np.float16)
    whole = quant.quantize(weight, group_size=32, grid="mse")
    per_channel = quant.quantize(weight, group_size=-1, grid="mse")
    # 1 group, 5 groups (uneven last block), a group split into columns: 8 and 1
    for block_elems in (32 * 16, 5 * 32 * 16, 32 * 8, 32):
        monkeypatch.setattr(quant, "_BLOCK_ELEMS", block_elems)
        for x, y in zip(quant.quantize(weight, group_size=32, grid="mse"), whole):
            np.testing.assert_array_equal(x, y)
        for x, y in zip(quant.quantize(weight, group_size=-1, grid="mse"), per_channel):
            np.testing.assert_array_equal(x, y)


def test_mse_grid_torch_in_torch_out():
    torch = pytest.importorskip("torch")
    weight = torch.randn(64, 16, generator=torch.Generator().manual_seed(33))
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        got = quant.quantize(weight.to(dtype), group_size=32, grid="mse")
        want = quant.quantize(weight.to(dtype).numpy() if dtype != torch.bfloat16 else
                              weight.to(dtype), group_size=32, grid="mse")
        for g, w in zip(got, want):
            assert isinstance(g, torch.Tensor)
            assert torch.equal(g, w if isinstance(w, torch.Tensor) else torch.from_numpy(w))
        assert got[2].dtype == dtype


# --- act_order and the defaults with a hessian --------------------------------------




def test_act_order_keeps_the_group_layout():
    """Every grid is fixed from the weights before the first row is rounded (with
    min-max grids: exactly min-max's, in every group, while the fed errors move
    values beyond half a step), and the order follows the diagonal, not the row
    index: permuting rows within their groups (and H alike) permutes the rows of
    the result."""
    rng = np.random.default_rng(35)
    K, N, G = 256, 32, 64
    X = correlated_inputs(rng, 2048, K) * rng.uniform(0.2, 3, K)
    H = X.T @ X
    weight = (rng.standard_normal((K, N)) * 0.05).astype(np.float32)
    qweight, qzeros, scales = quant.quantize(weight, group_size=G, hessian=H, grid="minmax",
                                             act_order=True, refine=0)
    _, want_zeros, want_scales = quant.quantize(weight, group_size=G)
    np.testing.assert_array_equal(qzeros, want_zeros)
    np.testing.assert_array_equal(scales, want_scales)
    q = quant.unpack(qweight).astype(np.float64)
    zero = np.repeat(quant.unpack(qzeros), G, axis=0)
    step = np.repeat(scales.astype(np.float64), G, axis=0)
    assert (np.abs(weight - (q - zero) * step) > step / 2 * 1.001).any()  # errors were fed

    perm = np.concatenate([g0 + rng.permutation(G) for g0 in range(0, K, G)])
    for grid in ("minmax", "mse"):
        want = quant.quantize(weight, group_size=G, hessian=H, grid=grid, refine=0)
        got = quant.quantize(weight[perm], group_size=G, hessian=H[np.ix_(perm, perm)],
                             grid=grid, refine=0)
        np.testing.assert_array_equal(quant.unpack(got[0]), quant.unpack(want[0])[perm])
        if grid == "minmax":  # the mse search sums each group's errors in another order
            np.testing.assert_array_equal(got[1], want[1])
            np.testing.assert_array_equal(got[2], want[2])


def test_gptq_defaults_are_act_order_on_mse_grids_and_deterministic():
    rng = np.random.default_rng(36)
    K, N, G = 128, 16, 32
    X = correlated_inputs(rng, 512, K)
    weight = (rng.standard_normal((K, N)) * 0.05).astype(np.float16)
    got = quant.quantize(weight, group_size=G, hessian=X.T @ X)
    for want in (quant.quantize(weight, group_size=G, hessian=X.T @ X, grid="mse",
                                act_order=True),
                 quant.quantize(weight, group_size=G, hessian=X.T @ X)):
        for x, y in zip(got, want):
            np.testing.assert_array_equal(x, y)
    for x, y in zip(quant.quantize(weight, group_size=G), quant.quantize(
            weight, group_size=G, grid="minmax", act_order=False)):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("G", [32, 128, 256])
def test_act_order_and_mse_grids_reduce_the_output_error_further(G):
    """On inputs whose features differ in energy, as a trained layer's do, each of
    act order and MSE grids lowers ||X W - X W_q|| below GPTQ in row order on
    min-max grids, on new inputs of the same distribution too, and together they
    lower it most."""
    rng = np.random.default_rng(37)
    K, N = 256, 64
    X, X_new = np.split(correlated_inputs(rng, 4096, K) * rng.uniform(0.2, 3, K), 2)
    weight = (rng.standard_normal((K, N)) * 0.05).astype(np.float32)
    H = X.T @ X
    errors = {}
    for grid in ("minmax", "mse"):
        for act_order in (False, True):
            result = quant.quantize(weight, group_size=G, hessian=H, grid=grid,
                                    act_order=act_order, refine=0)
            delta = weight - dequantized(result, G)
            errors[grid, act_order] = np.linalg.norm(X @ delta), np.linalg.norm(X_new @ delta)
    base = errors["minmax", False]
    for key in (("minmax", True), ("mse", False), ("mse", True)):
        assert all(e < b for e, b in zip(errors[key], base)), (key, errors[key], base)
    assert errors["mse", True][0] == min(e[0] for e in errors.values())


def test_default_gptq_under_strong_feedback():
    """Nearly collinear inputs, float16 scales, edge columns: act order on MSE grids
    gives positive finite scales, zero points in 0..15 and finite values."""
    rng = np.random.default_rng(38)
    K, N, G = 128, 16, 32
    X = rng.standard_normal((4096, 4)) @ rng.standard_normal((4, K))
    X += 1e-3 * rng.standard_normal((4096, K))
    weight = edge_weight(rng, K, N, "float16")
    qweight, qzeros, scales = quant.quantize(weight, group_size=G, hessian=X.T @ X)
    assert scales.dtype == np.float16 and np.isfinite(scales).all() and (scales > 0).all()
    assert quant.unpack(qzeros).max() <= 15
    assert np.isfinite(dequantized((qweight, qzeros, scales), G)).all()


def test_grid_and_act_order_are_checked_before_any_work():
    weight = np.zeros((64, 8), np.float32)
    H = np.eye(64)
    for grid in ("MSE", "", "min-max"):
        with pytest.raises(ValueError, match=f"^grid must be 'minmax' or 'mse'; got {grid!r}$"):
            quant.quantize(weight, group_size=32, grid=grid)
    for grid in (1, True, b"mse"):
        with pytest.raises(TypeError, match=f"^grid must be 'minmax' or 'mse' .*got "
                                            f"{type(grid).__name__}$"):
            quant.quantize(weight, group_size=32, hessian=H, grid=grid)
    for act_order in ("yes", 1, 0.0):
        with pytest.raises(TypeError, match=f"^act_order must be True, False or None .*got "
                                            f"{type(act_order).__name__}$"):
            quant.quantize(weight, group_size=32, hessian=H, act_order=act_order)
    with pytest.raises(ValueError, match="^act_order=True needs a hessian"):
        quant.quantize(weight, group_size=32, act_order=True)
    quant.quantize(weight, group_size=32, act_order=False)  # accepted, and ignored
    quant.quantize(weight, group_size=32, hessian=H, act_order=np.bool_(True))


def test_quantize_model_passes_grid_act_order_and_refine_on():
    torch = pytest.importorskip("torch")
    from awq_fast_dequant.torch import AWQLinear, quantize_model

    torch.manual_seed(39)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
    inputs = [torch.randn(40, 64) for _ in range(3)]
    for options in ({"grid": "mse"}, {"grid": "minmax", "act_order": False},
                    {"act_order": False, "refine": 0}):
        quantized = torch.nn.Sequential(*(torch.nn.Linear(m.in_features, m.out_features)
                                          if isinstance(m, torch.nn.Linear) else m
                                          for m in model))
        quantized.load_state_dict(model.state_dict())
        assert quantize_model(quantized, 32, calibration=inputs, **options) == []
        hessian = inputs[0].T @ inputs[0]  # accumulated as quantize_model does
        for x in inputs[1:]:
            hessian.addmm_(x.T, x)
        want = AWQLinear.from_linear(model[0], 32, hessian=hessian, **options)
        assert torch.equal(quantized[0].qweight, want.qweight)
        assert torch.equal(quantized[0].scales, want.scales)
    plain = torch.nn.Sequential(torch.nn.Linear(64, 32))
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if k.startswith("0.")})
    quantize_model(plain, 32, grid="mse")
    assert torch.equal(plain[0].qweight, AWQLinear.from_linear(model[0], 32, grid="mse").qweight)
    for options, error in (({"grid": "fast"}, ValueError), ({"act_order": True}, ValueError),
                           ({"act_order": "yes"}, TypeError), ({"refine": 1}, ValueError),
                           ({"refine": -1}, ValueError), ({"refine": 0.5}, TypeError)):
        with pytest.raises(error, match="grid|act_order|refine"):
            quantize_model(torch.nn.Sequential(torch.nn.Linear(64, 32)), 32, **options)


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
