"""linear(): y = x @ W + bias from the packed weights (DESIGN.md section 7).

Every result is held to the tolerance against a float64 reference built from
the reference dequantization (conftest.assert_linear_close); the fused path is
also deterministic.  GPU tests skip without a usable GPU."""

import os

import numpy as np
import pytest

import awq_fast_dequant as awq
from awq_fast_dequant import _C, reference

from conftest import (DTYPES, as_float64, assert_linear_close, assert_within_reference,
                      linear_problem, linear_reference, make_problem, np_dtype)

bits = reference.to_bits
PATHS = ("fused", "dequant", "auto")


@pytest.fixture(autouse=True)
def private_cache(cache_dir):
    """Tuning writes to a private cache folder, never the user's."""
    return cache_dir


# ---- the CPU paths ----

# (K, N, G): one group, G = K with a K tail, N = 8, N tails, several groups
CPU_SHAPES = [(32, 8, 32), (64, 24, 32), (200, 40, 200), (128, 136, 64), (96, 64, 32),
              (256, 72, 128)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("K, N, G", CPU_SHAPES)
def test_cpu_fused_within_tolerance(rng, dtype, K, N, G):
    for M in (1, 2, 3, 4, 5, 8, 17):
        for bias in (True, False):
            x, qw, qz, sc, b = linear_problem(rng, M, K, N, G, dtype, bias=bias)
            y = awq.linear(x, qw, qz, sc, b, path="fused")
            assert y.shape == (M, N) and y.dtype == x.dtype
            assert_linear_close(y, x, qw, qz, sc, b)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_paths_within_tolerance(rng, path, dtype):
    x, qw, qz, sc, b = linear_problem(rng, 6, 256, 64, 64, dtype)
    assert_linear_close(awq.linear(x, qw, qz, sc, b, path=path), x, qw, qz, sc, b)


@pytest.mark.parametrize("M", [0, 1, 7])
def test_any_leading_dimensions(rng, M):
    K, N, G = 128, 48, 32
    for lead in ((M,), (2, M), (3, 1, M)):
        x, qw, qz, sc, b = linear_problem(rng, M, K, N, G, "float32", lead=lead)
        for path in PATHS:
            y = awq.linear(x, qw, qz, sc, b, path=path)
            assert y.shape == lead + (N,)
            assert_linear_close(y, x, qw, qz, sc, b)
    x1 = linear_problem(rng, 1, K, N, G, "float32", lead=())[0]  # 1-D x: one row
    assert x1.shape == (K,)
    y1 = awq.linear(x1, qw, qz, sc)
    assert y1.shape == (N,)
    assert_linear_close(y1, x1, qw, qz, sc, None)


def test_k_zero_is_the_bias(rng):
    x = np.zeros((3, 0), np.float32)
    qw = np.zeros((0, 2), np.int32)
    qz = np.zeros((0, 2), np.int32)
    sc = np.zeros((0, 16), np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    np.testing.assert_array_equal(awq.linear(x, qw, qz, sc, b), np.broadcast_to(b, (3, 16)))
    np.testing.assert_array_equal(awq.linear(x, qw, qz, sc), np.zeros((3, 16), np.float32))


@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_and_inf_scales_propagate_as_in_the_reference(rng, dtype):
    for path in PATHS:
        x, qw, qz, sc, b = linear_problem(rng, 5, 128, 64, 32, dtype, specials=True)
        assert np.isnan(as_float64(sc)).any() and np.isinf(as_float64(sc)).any()
        y = awq.linear(x, qw, qz, sc, b, path=path)
        assert np.isnan(as_float64(y)).any()
        assert_linear_close(y, x, qw, qz, sc, b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_identity_rows_give_w_exactly(rng, dtype):
    """x = the identity: y = W, the values dequantize writes (subnormal and
    large scales included), on every path."""
    K, N, G = 64, 48, 32
    qw, qz, sc = make_problem(rng, K, N, G, "float32", specials=False)
    sc[0, :8] = [2.0**-20, -2.0**-24, 3 * 2.0**-23, 2.0**-15, 4000.0, -1e-3, 1e3, 2.0**-130]
    nd = np_dtype(dtype)
    sc = sc.astype(nd)
    want = as_float64(awq.dequantize(qw, qz, sc))
    x = np.eye(K, dtype=np.float32).astype(nd)
    for path in PATHS:
        got = as_float64(awq.linear(x, qw, qz, sc, path=path))
        np.testing.assert_array_equal(got, want)


def test_group_size_argument(rng):
    x, qw, qz, sc, b = linear_problem(rng, 3, 96, 32, 96, "float32")
    for g in (None, 96, -1, np.int64(96)):
        assert_linear_close(awq.linear(x, qw, qz, sc, b, group_size=g), x, qw, qz, sc, b)
    with pytest.raises(ValueError, match="group_size 32 gives"):
        awq.linear(x, qw, qz, sc, b, group_size=32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_is_deterministic(rng, dtype):
    x, qw, qz, sc, b = linear_problem(rng, 4, 512, 256, 128, dtype)
    first = awq.linear(x, qw, qz, sc, b, path="fused")
    for _ in range(3):
        np.testing.assert_array_equal(bits(awq.linear(x, qw, qz, sc, b, path="fused")),
                                      bits(first))


# ---- the host's AMX kernel (csrc/cpu/amx.c) ----

AMX = awq.build_info()["cpu_amx"]
needs_amx = pytest.mark.skipif(not AMX, reason="this host (or build) has no AMX tiles")


def _run_config(x, qw, qz, sc, b, cfg):
    out = np.full(x.shape[:-1] + (qw.shape[1] * 8,), np.nan, x.dtype)
    _C._dev.linear_config(x, qw, qz, sc, b, out, cfg)
    return out


@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_amx_candidates(rng, dtype):
    """The tuner tries the AMX kernel where the host runs it, after every configuration
    of the vector kernel: for an even G, and for float16 and float32 a G that is a
    multiple of 32 or K."""
    for G, M in ((64, 3), (64, 40), (21, 3), (16, 3), (126, 3)):
        x, qw, qz, sc, _ = linear_problem(rng, M, 126 if G in (21, 126) else 256, 64, G, dtype)
        kernels = [c["kernel"] for c in _C._dev.linear_candidates(x, qw, qz, sc)]
        amx = AMX and G % 2 == 0 and (dtype == "bfloat16" or G % 32 == 0 or G == 126)
        assert ("amx" in kernels) == amx
        assert kernels == sorted(kernels, key=lambda k: k == "amx")


@needs_amx
@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_amx_every_config_within_tolerance_and_the_same_bits(dtype):
    """Every configuration of the AMX kernel: within the tolerance, and the same bits
    as each other (the order of each sum is the problem's alone).  Tails of the 16-row
    and 16- and 64-column tiles, several 256-row blocks of the sum, G = 8 (bfloat16)
    and G = K, more than 256 rows of x."""
    rng = np.random.default_rng(5)
    for M, K, N, G in [(1, 64, 8, 64), (17, 256, 136, 128), (40, 640, 520, 128),
                       (3, 200, 40, 8), (260, 256, 72, 64), (5, 100, 24, 100)]:
        if dtype != "bfloat16" and G == 8:
            continue
        x, qw, qz, sc, b = linear_problem(rng, M, K, N, G, dtype)
        first = _run_config(x, qw, qz, sc, b, {"kernel": "amx"})
        assert_linear_close(first, x, qw, qz, sc, b)
        cands = [c for c in _C._dev.linear_candidates(x, qw, qz, sc) if c["kernel"] == "amx"]
        assert len(cands) > 1
        for cfg in cands:
            np.testing.assert_array_equal(bits(_run_config(x, qw, qz, sc, b, cfg)), bits(first))


@needs_amx
@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_amx_identity_rows_give_w_exactly(rng, dtype):
    """x = the identity through the AMX kernel: y = W, dequantize's values (float16 and
    float32 round (q - z) s, exact in float32, once), bit for bit."""
    K, N, G = 64, 48, 32
    qw, qz, sc = make_problem(rng, K, N, G, "float32", specials=False)
    sc[0, :6] = [2.0**-20, -2.0**-24, 3 * 2.0**-23, 2.0**-15, 4000.0, -1e-3]
    sc = sc.astype(np_dtype(dtype))
    want = as_float64(awq.dequantize(qw, qz, sc))
    x = np.eye(K, dtype=np.float32).astype(np_dtype(dtype))
    got = as_float64(_run_config(x, qw, qz, sc, None, {"kernel": "amx"}))
    np.testing.assert_array_equal(got, want)


# (dtype, where, a value the tiles do not take): float16 takes any finite x and finite
# scales below 2^12; bfloat16 and float32 bound the least and largest exponents of x
# and the scales together (csrc/cpu/amx.c): none of these meets the bounds with the
# other array as linear_problem makes it
OUTSIDE = ([(dtype, w, v) for dtype in ("bfloat16", "float32") for w in ("x", "scales")
            for v in (2.0**-120, -2.0**118, 2.0**-140, float("inf"), float("nan"))]
           + [("float16", "x", v) for v in (float("inf"), float("nan"))]
           + [("float16", "scales", v) for v in (4096.0, -60000.0, float("inf"), float("nan"))])


@needs_amx
@pytest.mark.parametrize("dtype, where, value", OUTSIDE)
def test_cpu_amx_leaves_values_outside_its_range_to_the_vector_kernel(rng, dtype, where, value):
    """A value the tiles would flush or could overflow on: the call runs the vector
    kernel, bit for bit."""
    x, qw, qz, sc, b = linear_problem(rng, 5, 128, 72, 32, dtype)
    target = x if where == "x" else sc
    target.reshape(-1)[7] = value
    got = _run_config(x, qw, qz, sc, b, {"kernel": "amx"})
    np.testing.assert_array_equal(bits(got), bits(_run_config(x, qw, qz, sc, b, {"kernel": "cpu"})))
    assert_linear_close(got, x, qw, qz, sc, b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_untuned_calls_above_the_fused_m_run_on_amx(rng, monkeypatch, matmul_calls, dtype):
    """With nothing tuned, calls above M = 8 take the AMX kernel where the host runs it
    (no matmul), else dequantize + matmul."""
    monkeypatch.setenv("AWQ_FAST_DEQUANT_AUTOTUNE", "0")
    _C._dev.cache_reload()
    amx = AMX
    x, qw, qz, sc, b = linear_problem(rng, 24, 256, 64, 64, dtype)
    assert_linear_close(awq.linear(x, qw, qz, sc, b), x, qw, qz, sc, b)
    assert len(matmul_calls) == (0 if amx else 1)
    x8 = linear_problem(rng, 8, 256, 64, 64, dtype)[0]
    assert_linear_close(awq.linear(x8, qw, qz, sc, b), x8, qw, qz, sc, b)
    assert len(matmul_calls) == (0 if amx else 1)  # M = 8: the vector kernel


# The host's dequantize path takes float32 W of torch tensors in slabs of whole groups of at
# most 16 MiB: at N = 2048 and G = 128, 2048 rows; K = 2688 makes a whole slab and a shorter
# one.
SLAB_K, SLAB_N, SLAB_G, SLAB_ROWS = 2688, 2048, 128, 2048


class HookCalls(list):
    """(w's shape, the slab arguments) of every call to the framework's matmul; `timed`:
    w's shape for every call to its timer."""

    def __init__(self):
        super().__init__()
        self.timed = []


@pytest.fixture
def matmul_calls():
    """The calls linear makes to the framework's matmul and to its timer (HookCalls),
    which both still run."""
    from awq_fast_dequant import _frameworks

    calls = HookCalls()

    def spy(x, w, bias, y, stream, *slab):
        calls.append((tuple(w.shape), slab))
        return _frameworks.matmul(x, w, bias, y, stream, *slab)

    def timer_spy(x, w, bias, y, stream):
        calls.timed.append(tuple(w.shape))
        return _frameworks.time_matmul(x, w, bias, y, stream)

    _C._set_hooks(_frameworks.allocate, _frameworks.current_stream, spy, timer_spy)
    yield calls
    _C._set_hooks(_frameworks.allocate, _frameworks.current_stream, _frameworks.matmul,
                  _frameworks.time_matmul)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("lead", [(3,), (2, 2)])
def test_cpu_dequant_path_sums_float32_torch_in_slabs(rng, matmul_calls, bias, lead):
    torch = pytest.importorskip("torch")
    x, qw, qz, sc, b = (None if a is None else torch.from_numpy(a) for a in linear_problem(
        rng, 0, SLAB_K, SLAB_N, SLAB_G, "float32", bias=bias, lead=lead))
    y = awq.linear(x, qw, qz, sc, b, path="dequant")
    assert matmul_calls == [((SLAB_ROWS, SLAB_N), (0, SLAB_ROWS)),
                            ((SLAB_ROWS, SLAB_N), (SLAB_ROWS, SLAB_K - SLAB_ROWS))]
    assert isinstance(y, torch.Tensor) and y.shape == lead + (SLAB_N,)
    assert_linear_close(y, x, qw, qz, sc, b)
    np.testing.assert_array_equal(bits(awq.linear(x, qw, qz, sc, b, path="dequant")), bits(y))
    out = torch.full(lead + (SLAB_N,), 7.0)
    assert awq.linear(x, qw, qz, sc, b, out=out, path="dequant") is out
    np.testing.assert_array_equal(bits(out), bits(y))


def test_cpu_tuner_times_the_dequant_path_as_a_call_runs_it(rng, matmul_calls, private_cache):
    # on the host the dequantize path is timed whole, its slabs and buffer included, not
    # as the dequantize kernel plus the framework's matmul timer on a buffer made once
    torch = pytest.importorskip("torch")
    x, qw, qz, sc, b = (torch.from_numpy(a) for a in linear_problem(
        rng, 64, SLAB_K, SLAB_N, SLAB_G, "float32"))
    y = awq.linear(x, qw, qz, sc, b)  # M = 64: tuned here
    assert awq.cache_stats()["tunings"] == 1
    slab_calls = [c for c in matmul_calls if c[1]]
    assert matmul_calls.timed == [] and len(slab_calls) >= 8  # 1 + 3 timed runs, 2 slabs each
    assert set(slab_calls) == {((SLAB_ROWS, SLAB_N), (0, SLAB_ROWS)),
                               ((SLAB_ROWS, SLAB_N), (SLAB_ROWS, SLAB_K - SLAB_ROWS))}
    assert_linear_close(y, x, qw, qz, sc, b)


def test_cpu_dequant_path_numpy_slabs_add_up(rng):
    # NumPy arrays take W whole (below); the hook's NumPy form of the slabs, which other
    # frameworks' host arrays would reach, sums them as torch does
    from awq_fast_dequant import _frameworks

    for bias in (True, False):
        x, qw, qz, sc, b = linear_problem(rng, 0, SLAB_K, SLAB_N, SLAB_G, "float32", bias=bias,
                                          lead=(2, 3))
        w = awq.dequantize(qw, qz, sc)
        y = np.full((2, 3, SLAB_N), 7, np.float32)
        for k0 in range(0, SLAB_K, SLAB_ROWS):
            rows = min(SLAB_ROWS, SLAB_K - k0)
            slab = np.zeros((SLAB_ROWS, SLAB_N), np.float32)
            slab[:rows] = w[k0:k0 + rows]
            _frameworks.matmul(x, slab, b, y, None, k0, rows)
        assert_linear_close(y, x, qw, qz, sc, b)


@pytest.mark.parametrize("case", ["float16", "bfloat16", "numpy", "small"])
def test_cpu_dequant_path_takes_w_whole(rng, matmul_calls, case):
    # float16 / bfloat16: one rounding of the sum to the dtype, no partial sums held in y
    # between slabs; NumPy arrays; and a W of 16 MiB or less
    K = SLAB_ROWS if case == "small" else SLAB_K
    args = linear_problem(rng, 3, K, SLAB_N, SLAB_G, "float32")
    if case != "numpy":
        torch = pytest.importorskip("torch")
        dtype = getattr(torch, case if case in ("float16", "bfloat16") else "float32")
        args = tuple(torch.from_numpy(a) if a.dtype == np.int32 else torch.from_numpy(a).to(dtype)
                     for a in args)
    y = awq.linear(*args, path="dequant")
    assert matmul_calls == [((K, SLAB_N), ())]
    assert_linear_close(y, *args)


@pytest.mark.parametrize("dtype, K", [("float32", SLAB_K), ("float16", 256),
                                      ("bfloat16", 256)])
def test_dequant_path_takes_numpy_out_and_bias_with_torch_x(rng, dtype, K):
    # frameworks may be mixed on one device, on every path
    torch = pytest.importorskip("torch")
    x, qw, qz, sc, b = linear_problem(rng, 3, K, SLAB_N, SLAB_G, dtype)
    tx, tsc = (torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
               if dtype == "bfloat16" else torch.from_numpy(a) for a in (x, sc))
    b.flags.writeable = False
    for path in PATHS:
        out = np.full((3, SLAB_N), 7, x.dtype)
        assert awq.linear(tx, qw, qz, tsc, b, out=out, path=path) is out
        assert_linear_close(out, x, qw, qz, sc, b)
        y = awq.linear(tx, qw, qz, tsc, b, path=path)
        assert isinstance(y, torch.Tensor)
        assert_linear_close(y, x, qw, qz, sc, b)


def test_out_is_written_and_returned(rng):
    x, qw, qz, sc, b = linear_problem(rng, 2, 64, 16, 32, "float16", lead=(2, 2))
    out = np.full((2, 2, 16), 7, np.float16)
    for path in PATHS:
        out[...] = 7
        r = awq.linear(x, qw, qz, sc, b, out=out, path=path)
        assert r is out
        assert_linear_close(out, x, qw, qz, sc, b)


def test_torch_tensors_in_torch_out(rng):
    torch = pytest.importorskip("torch")
    for dtype in ("float16", "bfloat16", "float32"):
        x, qw, qz, sc, b = linear_problem(rng, 3, 128, 32, 64, "float32")
        td = getattr(torch, dtype)
        tx, tsc, tb = (torch.from_numpy(a).to(td) for a in (x, sc, b))
        tqw, tqz = torch.from_numpy(qw), torch.from_numpy(qz)
        for path in PATHS:
            y = awq.linear(tx, tqw, tqz, tsc, tb, path=path)
            assert isinstance(y, torch.Tensor) and y.dtype == td and y.shape == (3, 32)
            assert_linear_close(y, tx, tqw, tqz, tsc, tb)


# ---- the autotune cache: keyed by operation and M bucket ----

def test_tuning_is_keyed_by_operation_and_m_bucket(rng, private_cache):
    x, qw, qz, sc, b = linear_problem(rng, 1, 256, 64, 64, "float16")
    awq.linear(x, qw, qz, sc, b)                      # bucket 1: tuned
    x3 = linear_problem(rng, 3, 256, 64, 64, "float16")[0]
    awq.linear(x3, qw, qz, sc, b)                     # bucket 4: tuned
    x4 = linear_problem(rng, 4, 256, 64, 64, "float16")[0]
    y4 = awq.linear(x4, qw, qz, sc, b)                # bucket 4: a hit
    assert_linear_close(y4, x4, qw, qz, sc, b)
    awq.dequantize(qw, qz, sc)                        # dequantize is never tuned here
    stats = awq.cache_stats()
    assert (stats["tunings"], stats["hits"]) == (2, 1)
    linear = sorted((e["M"], e["K"], e["N"], e["G"]) for e in awq.cache_entries()
                    if e["op"] == "linear")
    assert linear == [(1, 256, 64, 64), (4, 256, 64, 64)]
    assert all(e["kernel"] in ("cpu", "amx", "dequant") for e in awq.cache_entries())
    text = (private_cache / "autotune.txt").read_text()
    assert "\tlinear\t256\t64\t64\t1\tfloat16\tfloat16\t" in text
    assert "\tlinear\t256\t64\t64\t4\tfloat16\tfloat16\t" in text


def test_untuned_when_autotune_is_off(rng, monkeypatch):
    monkeypatch.setenv("AWQ_FAST_DEQUANT_AUTOTUNE", "0")
    _C._dev.cache_reload()
    x, qw, qz, sc, b = linear_problem(rng, 2, 128, 32, 32, "float32")
    assert_linear_close(awq.linear(x, qw, qz, sc, b), x, qw, qz, sc, b)
    assert awq.cache_stats()["tunings"] == 0 and awq.cache_entries() == []


# ---- errors: each a clear exception, nothing written ----

def _call(kind, rng, **override):
    x, qw, qz, sc, b = linear_problem(rng, 3, 64, 16, 32, "float16")
    out = np.full((3, 16), 7, np.float16)
    args = dict(x=x, qweight=qw, qzeros=qz, scales=sc, bias=b, out=out)
    args.update(override)
    with pytest.raises(kind) as info:
        awq.linear(args.pop("x"), args.pop("qweight"), args.pop("qzeros"), args.pop("scales"),
                   args.pop("bias"), **args)
    assert (out == 7).all(), "out was written by a rejected call"
    return str(info.value)


ERRORS = [
    (ValueError, "x's last dimension must be K = 64", lambda r: dict(x=np.zeros((3, 32), np.float16))),
    (TypeError, "scales must have x's dtype float16, got float32",
     lambda r: dict(scales=np.zeros((2, 16), np.float32))),
    (TypeError, "bias must have x's dtype float16", lambda r: dict(bias=np.zeros(16, np.float32))),
    (TypeError, "out must have x's dtype float16", lambda r: dict(out=np.zeros((3, 16), np.float32))),
    (TypeError, "x must be float16, bfloat16 or float32", lambda r: dict(x=np.zeros((3, 64), np.int32))),
    (ValueError, r"bias must have shape \(16,\)", lambda r: dict(bias=np.zeros(8, np.float16))),
    (ValueError, "bias must be a 1-D array", lambda r: dict(bias=np.zeros((1, 16), np.float16))),
    (ValueError, r"out must have shape \(3, 16\)", lambda r: dict(out=np.zeros((3, 8), np.float16))),
    (ValueError, "x is not C-contiguous", lambda r: dict(x=np.zeros((64, 3), np.float16).T)),
    (ValueError, "path must be 'auto', 'fused' or 'dequant'", lambda r: dict(path="gemm")),
    (TypeError, "path must be a str", lambda r: dict(path=1)),
    (ValueError, "stream applies to CUDA tensors", lambda r: dict(stream=0)),
    (TypeError, "qweight must be int32 or uint32", lambda r: dict(qweight=np.zeros((64, 2), np.int64))),
    (ValueError, "qzeros must have 2 columns", lambda r: dict(qzeros=np.zeros((2, 3), np.int32))),
    (TypeError, "unexpected keyword argument 'kernel'", lambda r: dict(kernel="v4")),
]


@pytest.mark.parametrize("kind, message, make", ERRORS, ids=[e[1][:30] for e in ERRORS])
def test_bad_arguments(rng, kind, message, make):
    import re
    assert re.search(message, _call(kind, rng, **make(rng)))


def test_read_only_and_overlapping_out(rng):
    x, qw, qz, sc, b = linear_problem(rng, 3, 64, 16, 32, "float16")
    ro = np.full((3, 16), 7, np.float16)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="out is read-only"):
        awq.linear(x, qw, qz, sc, b, out=ro)
    buf = np.full(3 * 64, 7, np.float16)
    xs = buf.reshape(3, 64)
    xs[...] = x
    with pytest.raises(ValueError, match="out overlaps x"):
        awq.linear(xs, qw, qz, sc, b, out=buf[:48].reshape(3, 16))
    np.testing.assert_array_equal(xs, x)


def test_missing_and_extra_arguments(rng):
    x, qw, qz, sc, b = linear_problem(rng, 3, 64, 16, 32, "float16")
    with pytest.raises(TypeError, match="missing required argument 'scales'"):
        awq.linear(x, qw, qz)
    with pytest.raises(TypeError, match="takes 5 positional arguments"):
        awq.linear(x, qw, qz, sc, b, 32)


# ---- fork ----

@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def _same_bits_in_a_forked_child(call):
    """Runs call() here, then three times in a child forked after it: whether the child
    got the same bits every time (its exit status, checked here)."""
    from test_robustness import _child_status
    want = bits(call())
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if all(np.array_equal(bits(call()), want) for _ in range(3)) else 3
        except BaseException:
            code = 2
        os._exit(code)
    assert _child_status(pid, timeout=60) == 0


def test_fork_after_a_linear_call(rng):
    x, qw, qz, sc, b = linear_problem(rng, 4, 512, 1024, 128, "float16")
    _same_bits_in_a_forked_child(lambda: awq.linear(x, qw, qz, sc, b, path="fused"))


@needs_amx
def test_fork_after_an_amx_call(rng):
    """A child forked after the AMX kernel ran (the tiles' state granted to the parent,
    OpenMP's threads gone) runs it on one thread: the same bits."""
    x, qw, qz, sc, b = linear_problem(rng, 20, 512, 1024, 128, "bfloat16")
    _same_bits_in_a_forked_child(lambda: _run_config(x, qw, qz, sc, b, {"kernel": "amx"}))


# ---- CUDA ----

cuda = pytest.mark.skipif(not awq.cuda_available(), reason="needs a CUDA GPU")


def _to(torch, arrays, device, dtype):
    x, qw, qz, sc, b = arrays
    td = getattr(torch, dtype)
    f = (lambda a: None if a is None else torch.from_numpy(np.asarray(a, np.float32)).to(device, td))
    return f(x), torch.from_numpy(qw).to(device), torch.from_numpy(qz).to(device), f(sc), f(b)


# Shapes that exercise every tail of the fused kernels: N not a multiple of 64 or
# 128, K not a multiple of 16 or the K tile, G in {32, 64, 128, K}.
CUDA_SHAPES = [(128, 64, 32), (256, 136, 64), (384, 200, 128), (200, 72, 200), (512, 8, 128),
               (4096, 264, 128), (1536, 1536, 128), (96, 1032, 32)]
CUDA_MS = [1, 2, 3, 4, 5, 8, 15, 16, 17, 31, 64, 100, 128, 257]


@cuda
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("K, N, G", CUDA_SHAPES)
def test_cuda_fused_within_tolerance(rng, dtype, K, N, G):
    torch = pytest.importorskip("torch")
    for M in CUDA_MS:
        arrays = linear_problem(rng, M, K, N, G, "float32", bias=M % 2 == 1)
        tx, tqw, tqz, tsc, tb = _to(torch, arrays, "cuda", dtype)
        y = awq.linear(tx, tqw, tqz, tsc, tb, path="fused")
        assert y.is_cuda and y.dtype == tx.dtype and y.shape == (M, N)
        assert_linear_close(y, tx, tqw, tqz, tsc, tb)


def _identity_problem(torch, rng, K, N, G, dtype):
    """Weights whose scales include subnormal, large and tiny values, on the
    GPU, with their dequantization (float32) and the identity of size K."""
    qw, qz, sc = make_problem(rng, K, N, G, "float32", specials=False)
    sc[0, :8] = [2.0**-20, -2.0**-24, 3 * 2.0**-23, 2.0**-15, 4000.0, -1e-3, 1e3, 2.0**-130]
    td = getattr(torch, dtype)
    tqw, tqz = torch.from_numpy(qw).cuda(), torch.from_numpy(qz).cuda()
    tsc = torch.from_numpy(sc).to("cuda", td)
    want = awq.dequantize(tqw, tqz, tsc).float()
    return tqw, tqz, tsc, want, torch.eye(K, device="cuda", dtype=td)


def _config_rows(torch, x, tqw, tqz, tsc, cfg):
    out = torch.full((x.shape[0], tqw.shape[1] * 8), float("nan"), device="cuda", dtype=x.dtype)
    _C._dev.linear_config(x, tqw, tqz, tsc, None, out, cfg)
    return out.float()


@cuda
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_cuda_identity_rows_give_w_exactly(rng, dtype):
    torch = pytest.importorskip("torch")
    tqw, tqz, tsc, want, x = _identity_problem(torch, rng, 128, 200, 32, dtype)
    for cfg in _C._dev.linear_candidates(x, tqw, tqz, tsc) + [{"kernel": "dequant"}]:
        assert torch.equal(_config_rows(torch, x, tqw, tqz, tsc, cfg), want), cfg


@cuda
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cuda_gemv_identity_rows_give_w_exactly(rng, dtype):
    """The decode kernel's W is the dequantize kernels' W, bit for bit: 8, 16
    and 32 rows of the identity at a time (one, two and four n8 tiles of x)
    give those rows of W through every decode configuration.  Beyond 16 rows
    the decode kernel is a tuning candidate, not the default, and only where
    8 K slices get 4 k16 steps each (K >= 512)."""
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("the decode kernel needs sm_80")
    for rows, K in ((8, 256), (16, 256), (32, 512)):
        tqw, tqz, tsc, want, eye = _identity_problem(torch, rng, K, 288, 32, dtype)
        cands = _C._dev.linear_candidates(eye[:rows], tqw, tqz, tsc)
        if rows <= 16:
            assert cands[0]["kernel"] == "gemv"
        else:
            assert "gemv" in [c["kernel"] for c in cands]
        for cfg in (c for c in cands if c["kernel"] == "gemv"):
            for r0 in range(0, K, rows):
                got = _config_rows(torch, eye[r0:r0 + rows].contiguous(), tqw, tqz, tsc, cfg)
                assert torch.equal(got, want[r0:r0 + rows]), (cfg, rows, r0)


@cuda
def test_cuda_tuned_layer_then_a_misaligned_view(rng):
    """The autotune cache is keyed by the layer and M bucket, not by the
    arrays' alignment: after a call on aligned tensors tuned a kernel that
    needs 16-byte alignment, a misaligned view of the same layer runs on the
    default configuration instead of failing."""
    torch = pytest.importorskip("torch")
    M, K, N, G = 1, 256, 136, 32
    arrays = linear_problem(rng, M, K, N, G, "float32", bias=True)
    tx, tqw, tqz, tsc, tb = _to(torch, arrays, "cuda", "float16")
    assert_linear_close(awq.linear(tx, tqw, tqz, tsc, tb, path="fused"), tx, tqw, tqz, tsc, tb)
    tuned = [e for e in awq.cache_entries() if e["op"] == "linear" and (e["K"], e["N"], e["G"], e["M"])
             == (K, N, G, 1) and e["scales_dtype"] == "float16" and not e["device"].startswith("cpu")]
    if not tuned or tuned[-1]["kernel"] not in ("gemv", "mma"):
        pytest.skip("autotune off, or the tuner picked a kernel that takes any alignment")

    def shifted(t):  # the same values 2 bytes past an aligned address
        buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
        view = buf[1:].view(t.shape)
        view.copy_(t)
        return view

    mx, msc, mb = shifted(tx), shifted(tsc), shifted(tb)
    assert msc.data_ptr() % 16 != 0
    for path in ("fused", "auto"):
        assert_linear_close(awq.linear(mx, tqw, tqz, msc, mb, path=path), tx, tqw, tqz, tsc, tb)


@cuda
def test_cuda_gemv_is_the_decode_default_and_falls_back(rng):
    """M <= 16 on a layer it can run goes to the decode kernel; M = 17..32 to
    the MMA kernel, with the decode kernel among the tuner's candidates; from
    M = 33 the warpgroup kernel on an H100/H200; what the decode kernel cannot
    run (M = 33, N % 32 != 0, K % 16 != 0, float32) to the other kernels."""
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("the decode kernel needs sm_80")

    def kernels(M, K, N, G, dtype="float16"):
        tx, tqw, tqz, tsc, _ = _to(torch, linear_problem(rng, M, K, N, G, "float32"), "cuda",
                                   dtype)
        return [c["kernel"] for c in _C._dev.linear_candidates(tx, tqw, tqz, tsc)]

    def first(*args):
        return kernels(*args)[0]

    assert [first(M, 512, 256, 128) for M in (1, 2, 5, 8, 9, 16)] == ["gemv"] * 6
    assert first(17, 512, 256, 128) == "mma"
    if _wgmma_runs(torch):  # from 33 rows the warpgroup kernel, where it runs
        assert first(33, 512, 256, 128) == "wgmma" and first(1024, 512, 256, 128) == "wgmma"
        assert first(33, 512, 256, 32) == "mma"  # G = 32: a stage of 64 k spans two groups
    assert "gemv" in kernels(17, 512, 256, 128) and "gemv" in kernels(32, 512, 256, 128)
    assert "gemv" not in kernels(33, 512, 256, 128)
    assert first(1, 512, 200, 128) == "mma"       # N = 200: an odd number of words
    assert first(1, 512, 272, 128) == "mma"       # N = 272: words not in fours
    assert first(1, 200, 256, 200) == "mma"       # K = G = 200: no whole k16 steps
    assert first(1, 512, 256, 128, "float32") == "simt"


@cuda
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cuda_every_candidate_within_tolerance(rng, dtype):
    """Each configuration the tuner may pick, not only the default.  The
    decode-kernel (gemv) shapes: strip tails (N = 1056 is 8 strips and 4
    words, N = 288 2 strips and 4, N = 96 less than one strip), G = K, G = 16
    (a new group every step), M = 1..32 (one, two and four n8 tiles of x; rows
    past M in the last tile)."""
    torch = pytest.importorskip("torch")
    for M, (K, N, G) in [(1, (1536, 1536, 128)), (5, (512, 200, 128)), (17, (200, 72, 200)),
                         (64, (1024, 520, 64)), (130, (256, 136, 32)), (8, (640, 288, 64)),
                         (3, (256, 96, 256)), (2, (96, 32, 16)), (7, (1024, 1056, 128)),
                         (4, (4096, 1024, 128)), (12, (512, 288, 64)), (16, (256, 96, 256)),
                         (20, (512, 288, 64)), (32, (256, 1056, 32))]:
        tx, tqw, tqz, tsc, tb = _to(torch, linear_problem(rng, M, K, N, G, "float32"), "cuda",
                                    dtype)
        cands = _C._dev.linear_candidates(tx, tqw, tqz, tsc)
        assert cands and cands[0]["kernel"] in ("gemv", "wgmma", "mma", "simt")
        for cfg in cands:
            out = torch.full((M, N), float("nan"), device="cuda", dtype=tx.dtype)
            _C._dev.linear_config(tx, tqw, tqz, tsc, tb, out, cfg)
            assert_linear_close(out, tx, tqw, tqz, tsc, tb)
            again = torch.full_like(out, float("nan"))
            _C._dev.linear_config(tx, tqw, tqz, tsc, tb, again, cfg)
            assert torch.equal(again, out), cfg  # deterministic per configuration


@cuda
def test_cuda_untuned_crossover(rng, monkeypatch):
    """With tuning off, "auto" runs the fused kernel up to M = 32, and up to
    64 where the fused default is the warpgroup kernel; above, dequantize +
    matmul, which allocates the dense weight (the fused path, given out=,
    allocates nothing)."""
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("AWQ_FAST_DEQUANT_AUTOTUNE", "0")
    _C._dev.cache_reload()
    K, N, G = 512, 256, 128

    def allocations(M):
        tx, tqw, tqz, tsc, tb = _to(torch, linear_problem(rng, M, K, N, G, "float32"), "cuda",
                                    "float16")
        out = torch.empty((M, N), device="cuda", dtype=tx.dtype)
        torch.cuda.synchronize()
        before = torch.cuda.memory_stats()["allocation.all.allocated"]
        awq.linear(tx, tqw, tqz, tsc, tb, out=out)
        torch.cuda.synchronize()
        allocated = torch.cuda.memory_stats()["allocation.all.allocated"] - before
        assert_linear_close(out, tx, tqw, tqz, tsc, tb)
        return allocated

    fused_to = 64 if _wgmma_runs(torch) else 32
    assert allocations(32) == 0 and allocations(fused_to) == 0
    assert allocations(fused_to + 1) > 0 and allocations(1024) > 0
    assert awq.cache_stats()["tunings"] == 0


def _wgmma_runs(torch):
    """The warpgroup kernel runs: compute capability 9.0 and sm_90 code in the build."""
    return torch.cuda.get_device_capability() == (9, 0) and 90 in awq.build_info()["cuda_archs"]


def _wgmma_configs(torch, x, tqw, tqz, tsc):
    return [c for c in _C._dev.linear_candidates(x, tqw, tqz, tsc) if c["kernel"] == "wgmma"]


# (K, N, G): N past the last 128-column warpgroup (288: two and 4 words; 2080:
# sixteen and 4; with two warpgroups a block, the second of the last block has
# no column at all), N under one warpgroup (96) with G = K, several groups, a long K.
WGMMA_SHAPES = [(512, 288, 64), (1024, 2080, 128), (256, 96, 256), (4096, 512, 128)]
# tails of the 32-, 64- and 128-row tiles, and several tiles of rows
WGMMA_MS = [9, 15, 16, 17, 31, 33, 64, 100, 128, 129, 257, 1024]


@cuda
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("K, N, G", WGMMA_SHAPES)
def test_cuda_wgmma_every_config_within_tolerance(rng, dtype, K, N, G):
    """Every configuration of the warpgroup kernel the tuner may try (tiles of
    32, 64 and 128 rows; K split over 1, 2, 4 and 8 blocks of a cluster), on
    row, column and group tails, with a bias on odd M; each run twice gives
    the same bits."""
    torch = pytest.importorskip("torch")
    if not _wgmma_runs(torch):
        pytest.skip("the warpgroup kernel needs compute capability 9.0 and sm_90 code")
    for M in WGMMA_MS:
        arrays = linear_problem(rng, M, K, N, G, "float32", bias=M % 2 == 1)
        tx, tqw, tqz, tsc, tb = _to(torch, arrays, "cuda", dtype)
        ref = linear_reference(tx, tqw, tqz, tsc, tb)
        configs = _wgmma_configs(torch, tx, tqw, tqz, tsc)
        assert len(configs) >= 3, (M, configs)  # splits 1, 2 and 4 at least (K = 256 has 4 stages)
        for cfg in configs:
            out = torch.full((M, N), float("nan"), device="cuda", dtype=tx.dtype)
            _C._dev.linear_config(tx, tqw, tqz, tsc, tb, out, cfg)
            assert_within_reference(out, *ref)
            again = torch.full_like(out, float("nan"))
            _C._dev.linear_config(tx, tqw, tqz, tsc, tb, again, cfg)
            assert torch.equal(again, out), (M, cfg)


@cuda
def test_cuda_every_m_bucket_keeps_its_tuned_choice(rng):
    """Whatever wins a bucket -- any kernel, any configuration -- the autotune
    cache stores it: each bucket tunes once, and the next call is a hit."""
    torch = pytest.importorskip("torch")
    if os.environ.get("AWQ_FAST_DEQUANT_AUTOTUNE") == "0":
        pytest.skip("autotune off")
    K, N, G = 1024, 2048, 128
    for M in (1, 9, 33, 128, 257, 1024):
        tx, tqw, tqz, tsc, tb = _to(torch, linear_problem(rng, M, K, N, G, "float32"), "cuda", "float16")
        assert_linear_close(awq.linear(tx, tqw, tqz, tsc, tb), tx, tqw, tqz, tsc, tb)  # tunes
        before = awq.cache_stats()
        assert_linear_close(awq.linear(tx, tqw, tqz, tsc, tb), tx, tqw, tqz, tsc, tb)
        after = awq.cache_stats()
        assert after["tunings"] == before["tunings"] and after["hits"] == before["hits"] + 1, (M, before, after)
    stored = {e["M"] for e in awq.cache_entries() if e["op"] == "linear" and (e["K"], e["N"], e["G"])
              == (K, N, G) and not e["device"].startswith("cpu")}
    assert stored == {1, 16, 64, 128, 512, 1024}


@cuda
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cuda_wgmma_identity_rows_give_w_exactly(rng, dtype):
    """The warpgroup kernel's W is the dequantize kernels' W, bit for bit, in
    the right column: 32, 64 and 128 rows of the identity at a time give those
    rows of W through every configuration (the sums of a split add zeros)."""
    torch = pytest.importorskip("torch")
    if not _wgmma_runs(torch):
        pytest.skip("the warpgroup kernel needs compute capability 9.0 and sm_90 code")
    K = 512
    tqw, tqz, tsc, want, eye = _identity_problem(torch, rng, K, 288, 64, dtype)
    for rows in (32, 64, 128):  # a configuration's rows counts groups of 16
        configs = [c for c in _wgmma_configs(torch, eye[:rows], tqw, tqz, tsc) if 16 * c["rows"] == rows]
        assert configs, rows
        for cfg in configs:
            for r0 in range(0, K, rows):
                got = _config_rows(torch, eye[r0:r0 + rows].contiguous(), tqw, tqz, tsc, cfg)
                assert torch.equal(got, want[r0:r0 + rows]), (cfg, r0)


@cuda
@pytest.mark.parametrize("M", [1024])
def test_cuda_fused_large_m(rng, M):
    torch = pytest.importorskip("torch")
    arrays = linear_problem(rng, M, 1024, 512, 128, "float32")
    tx, tqw, tqz, tsc, tb = _to(torch, arrays, "cuda", "float16")
    assert_linear_close(awq.linear(tx, tqw, tqz, tsc, tb, path="fused"), tx, tqw, tqz, tsc, tb)


@cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("path", PATHS)
def test_cuda_paths_and_dtypes(rng, dtype, path):
    torch = pytest.importorskip("torch")
    for M in (1, 4, 33):
        arrays = linear_problem(rng, M, 256, 128, 64, "float32")
        tx, tqw, tqz, tsc, tb = _to(torch, arrays, "cuda", dtype)
        assert_linear_close(awq.linear(tx, tqw, tqz, tsc, tb, path=path), tx, tqw, tqz, tsc, tb)


@cuda
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_cuda_specials_odd_groups_and_3d(rng, dtype):
    torch = pytest.importorskip("torch")
    for (K, N, G) in [(96, 64, 32), (48, 24, 8), (120, 16, 24)]:  # G below 16: CUDA cores
        arrays = linear_problem(rng, 3, K, N, G, "float32", specials=True, lead=(2, 3))
        tx, tqw, tqz, tsc, tb = _to(torch, arrays, "cuda", dtype)
        for path in PATHS:
            assert_linear_close(awq.linear(tx, tqw, tqz, tsc, tb, path=path), tx, tqw, tqz, tsc, tb)


@cuda
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cuda_fused_is_deterministic(rng, dtype):
    torch = pytest.importorskip("torch")
    for M, (K, N) in [(1, (1536, 1536)), (16, (4096, 512)), (100, (2048, 1024))]:
        tx, tqw, tqz, tsc, tb = _to(torch, linear_problem(rng, M, K, N, 128, "float32"), "cuda",
                                    dtype)
        first = awq.linear(tx, tqw, tqz, tsc, tb, path="fused")
        for _ in range(3):
            assert torch.equal(awq.linear(tx, tqw, tqz, tsc, tb, path="fused"), first)


@cuda
def test_cuda_out_side_stream_and_graph(rng):
    torch = pytest.importorskip("torch")
    tx, tqw, tqz, tsc, tb = _to(torch, linear_problem(rng, 4, 1024, 256, 128, "float32"), "cuda",
                                "float16")
    want = awq.linear(tx, tqw, tqz, tsc, tb, path="fused")
    out = torch.full_like(want, 7)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        r = awq.linear(tx, tqw, tqz, tsc, tb, out=out, path="fused")
    assert r is out
    side.synchronize()
    assert torch.equal(out, want)
    out.fill_(7)
    awq.linear(tx, tqw, tqz, tsc, tb, out=out, stream=side, path="fused")
    side.synchronize()
    assert torch.equal(out, want)
    # capture and replay: the graph reads x's memory as it is at replay
    g = torch.cuda.CUDAGraph()
    static_out = torch.empty_like(want)
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        awq.linear(tx, tqw, tqz, tsc, tb, out=static_out)  # auto: never tunes under capture
    tx.mul_(-1)
    g.replay()
    torch.cuda.synchronize()
    assert_linear_close(static_out, tx, tqw, tqz, tsc, tb)


@cuda
def test_cuda_devices_differ(rng):
    torch = pytest.importorskip("torch")
    tx, tqw, tqz, tsc, tb = _to(torch, linear_problem(rng, 2, 64, 16, 32, "float32"), "cuda",
                                "float16")
    with pytest.raises(ValueError, match="all tensors must be on one device: x is on cpu but "
                                         "qweight is on cuda:0"):
        awq.linear(tx.cpu(), tqw, tqz, tsc, tb)
    with pytest.raises(ValueError, match="bias is on cpu"):
        awq.linear(tx, tqw, tqz, tsc, tb.cpu())


@cuda
@pytest.mark.skipif(_C.cuda_device_count() < 2, reason="needs two CUDA devices")
def test_cuda_second_device(rng):
    torch = pytest.importorskip("torch")
    for path in PATHS:
        tx, tqw, tqz, tsc, tb = _to(torch, linear_problem(rng, 5, 512, 128, 128, "float32"),
                                    "cuda:1", "float16")
        y = awq.linear(tx, tqw, tqz, tsc, tb, path=path)
        assert y.device == torch.device("cuda:1")
        assert_linear_close(y, tx, tqw, tqz, tsc, tb)
