"""Shared helpers: random AWQ problems (NumPy and torch), the hand-worked packed word,
dtype plumbing, a private autotune cache, child processes, threads; and a summary of
why tests were skipped."""

import collections
import os
import re
import threading

import numpy as np
import pytest

import awq_fast_dequant as awq
from awq_fast_dequant._frameworks import numpy_dtype
from awq_fast_dequant.bench.linear_check import numpy_float64

from awq_fast_dequant.reference import DTYPES  # noqa: E402  (the package's list)

# The correctness sweep: (K, G) with K in {G, 2G, 7G} for G in {32, 64, 128},
# and G = K (one group, per-channel scales); N with tails.
SWEEP_KG = tuple((G * m, G) for G in (32, 64, 128) for m in (1, 2, 7)) + tuple(
    (K, K) for K in (8, 96, 200))
SWEEP_N = (8, 16, 136, 4104)


# One packed word of DESIGN.md section 1, written out by hand. qweight word 0xBE0F92A7;
# its nibbles, least significant first:
#     nibble   0  1  2  3  4  5  6  7
#     value    7 10  2  9 15  0 14 11
# Column j reads nibble REVERSE[j] = [0, 4, 1, 5, 2, 6, 3, 7][j]:
#     column   0  1  2  3  4  5  6  7
#     q        7 15 10  0  2 14  9 11
# qzeros word 0x12345678: nibbles 8 7 6 5 4 3 2 1, so by column:
#     z        8  4  7  3  6  2  5  1
WORKED_QWEIGHT = 0xBE0F92A7
WORKED_QZEROS = 0x12345678
WORKED_Q = (7, 15, 10, 0, 2, 14, 9, 11)
WORKED_Z = (8, 4, 7, 3, 6, 2, 5, 1)


def np_dtype(name):
    """The NumPy dtype of a type name; skips the test where bfloat16 needs ml_dtypes."""
    if name == "bfloat16":
        pytest.importorskip("ml_dtypes")
    return numpy_dtype(name)


def words(*values):
    """A packed-word array (int32) from unsigned 32-bit values."""
    return np.array(values, dtype=np.uint32).view(np.int32)


def random_words(rng, shape, dtype=np.int32):
    """Every bit pattern is a valid packed word: draw all 32 bits."""
    return rng.integers(0, 2**32, size=shape, dtype=np.uint64).astype(np.uint32).view(dtype)


def make_problem(rng, K, N, G, scale_dtype="float16", word_dtype=np.int32, specials=True):
    """qweight, qzeros, scales for a [K, N] layer with group size G.

    Scales span several binades, both signs, and (with specials) NaN, +-Inf
    and +-0, so that rounding, sign of zero and NaN propagation are exercised."""
    qw = random_words(rng, (K, N // 8), word_dtype)
    qz = random_words(rng, (K // G if G else 0, N // 8), word_dtype)
    sc = (rng.standard_normal((qz.shape[0], N)) * np.exp2(rng.integers(-12, 8, (qz.shape[0], N))))
    sc = sc.astype(np.float32)
    if specials and sc.size >= 6:
        flat = sc.reshape(-1)
        idx = rng.choice(flat.size, size=6, replace=False)
        flat[idx] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 65504.0]
    return qw, qz, sc.astype(np_dtype(scale_dtype))


def torch_problem(rng, K, N, G, scale_dtype="float16", device="cpu"):
    """make_problem as torch tensors on `device`, the scales rounded to scale_dtype by
    torch (bfloat16 included, with or without ml_dtypes)."""
    torch = pytest.importorskip("torch")
    qw, qz, sc = make_problem(rng, K, N, G, "float32")
    return (torch.from_numpy(qw).to(device), torch.from_numpy(qz).to(device),
            torch.from_numpy(sc).to(device, getattr(torch, scale_dtype)))


class DLPackOnly:
    """A producer that speaks only the DLPack protocol (no NumPy, no exchange API)."""

    def __init__(self, arr, legacy=False):
        self.arr, self.legacy, self.calls = arr, legacy, []

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()

    def __dlpack__(self, stream=None, **kw):
        self.calls.append(dict(stream=stream, **kw))
        if self.legacy and "max_version" in kw:
            raise TypeError("unexpected keyword argument 'max_version'")
        return self.arr.__dlpack__(stream=stream, **kw)


@pytest.fixture
def rng(request):
    # a fresh, reproducible stream per test
    return np.random.default_rng(abs(hash(request.node.nodeid)) % 2**32)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A private autotune cache folder, never the user's; the module re-reads its settings."""
    d = tmp_path / "cache"
    monkeypatch.setenv("AWQ_FAST_DEQUANT_CACHE_DIR", str(d))
    monkeypatch.delenv("AWQ_FAST_DEQUANT_AUTOTUNE", raising=False)
    awq._C._dev.cache_reload()
    yield d
    awq._C._dev.cache_reload()


def child_env(**extra):
    """Environment for a child Python: it imports the same awq_fast_dequant as
    this process (installed, or an in-place build). Run the child in a folder
    other than the repository root: sys.path[0] (the cwd for -c and -m) comes
    before PYTHONPATH, and the source folder there would shadow the package."""
    home = os.path.dirname(os.path.dirname(os.path.abspath(awq.__file__)))
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (home, env.get("PYTHONPATH")) if p)
    return env


def run_threads(n, fn):
    """Runs fn(i) for i in range(n) on n threads released together; returns
    the exceptions they raised."""
    barrier, errors = threading.Barrier(n), []

    def body(i):
        try:
            barrier.wait()
            fn(i)
        except Exception as e:  # reported by the caller
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def skip_reason(report):
    """Why a test was skipped, as a group name: pytest's reason without its
    "Skipped: " prefix; importorskip's "could not import 'torch': ..." is "needs torch"."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    reason = reason.removeprefix("Skipped: ").strip()
    missing = re.match(r"could not import '([^']+)'", reason)
    return f"needs {missing.group(1)}" if missing else reason


def skip_summary(reasons):
    """One line: how many tests skipped, grouped by reason, largest group first."""
    counts = collections.Counter(reasons)
    groups = ", ".join(f"{n} {reason}" for reason, n in counts.most_common())
    return f"skipped: {sum(counts.values())} -- {groups}"


def pytest_terminal_summary(terminalreporter):
    skipped = terminalreporter.stats.get("skipped", [])
    if skipped:
        terminalreporter.write_line(skip_summary(skip_reason(r) for r in skipped))


# ---- linear(): problems, the float64 reference and DESIGN.md section 7's tolerance ----

# (mantissa bits, smallest normal exponent, largest finite) of each dtype
_FLOAT_FORMATS = {"float16": (10, -14, 65504.0), "bfloat16": (7, -126, 3.3895313892515355e38),
                  "float32": (23, -126, 3.4028234663852886e38)}


def linear_problem(rng, M, K, N, G, dtype="float16", bias=True, specials=False, lead=None):
    """x ([M, K], or lead + (K,)), qweight, qzeros, scales and bias (or None), NumPy,
    x / scales / bias in `dtype`.  Without specials the scales are finite and their
    size keeps products well inside every dtype's range."""
    qw, qz, sc = make_problem(rng, K, N, G, "float32", specials=specials)
    if not specials:
        sc = np.clip(sc, -64.0, 64.0)
    shape = tuple(lead) + (K,) if lead is not None else (M, K)
    x = rng.standard_normal(shape).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32) if bias else None
    nd = np_dtype(dtype)
    return (x.astype(nd), qw, qz, sc.astype(nd), None if b is None else b.astype(nd))


def as_float64(a):
    """A NumPy or torch array (any device, bfloat16 too: ml_dtypes' or, without it, as
    uint16 bits) as float64 NumPy."""
    if hasattr(a, "detach"):
        return a.detach().float().cpu().numpy().astype(np.float64)
    return numpy_float64(np.asarray(a))


def linear_reference(x, qw, qz, sc, bias, group_size=None):
    """(y64, bound): y64 = x @ W + bias in float64 with W the reference dequantization in
    x's dtype; bound = 2^-9 (|x| @ |W|), the sum part of the tolerance."""
    xs = as_float64(x)
    qwn, qzn = (np.asarray(a.cpu()) if hasattr(a, "cpu") else np.asarray(a) for a in (qw, qz))
    scn = as_float64(sc)
    dtype = str(getattr(x, "dtype", "")).replace("torch.", "")
    out_dtype = dtype if dtype in _FLOAT_FORMATS else str(np.asarray(x).dtype)
    # float32 scales hold every float16 / bfloat16 scale exactly: the same products
    W = awq.reference.dequantize(qwn, qzn, scn.astype(np.float32), group_size=group_size,
                                 out_dtype=out_dtype)
    W = as_float64(W)
    K = W.shape[0]
    x2 = xs.reshape(-1, K)
    with np.errstate(invalid="ignore", over="ignore"):
        y = x2 @ W
        bound = np.abs(x2) @ np.abs(W)
    if bias is not None:
        y = y + as_float64(bias)
    lead = xs.shape[:-1]
    return y.reshape(lead + (W.shape[1],)), 2.0**-9 * bound.reshape(lead + (W.shape[1],))


def _ulp(v, dtype):
    p, emin, _ = _FLOAT_FORMATS[dtype]
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.abs(v)))
    e = np.where(np.isfinite(e), np.maximum(e, emin), emin)
    return np.exp2(e - p)


def assert_linear_close(y, x, qw, qz, sc, bias, group_size=None):
    """y is within |y - y64| <= 2^-9 (|x| @ |W|) + 1 ulp of y's dtype of the float64
    reference; NaN exactly where the reference is NaN, the reference's infinities
    exactly, and an infinity elsewhere only where y64 rounds beyond the dtype's range."""
    assert_within_reference(y, *linear_reference(x, qw, qz, sc, bias, group_size))


def assert_within_reference(y, y64, bound):
    """assert_linear_close against a reference computed once (linear_reference)."""
    dtype = str(getattr(y, "dtype", "")).replace("torch.", "")
    if dtype not in _FLOAT_FORMATS:
        dtype = str(np.asarray(y).dtype)
    got = as_float64(y)
    assert got.shape == y64.shape, (got.shape, y64.shape)
    nan_ref = np.isnan(y64)
    assert np.array_equal(np.isnan(got), nan_ref), "NaN where the reference has none, or not"
    inf_ref = np.isinf(y64)
    assert np.array_equal(got[inf_ref], y64[inf_ref]), "the reference's infinities"
    fin = np.isfinite(y64)
    tol = bound[fin] + _ulp(y64[fin], dtype)
    over = ~np.isfinite(got[fin])
    maxf = _FLOAT_FORMATS[dtype][2]
    assert (np.abs(y64[fin][over]) + tol[over] >= maxf).all(), "overflow where none is due"
    err = np.abs(got[fin][~over] - y64[fin][~over])
    bad = err > tol[~over]
    assert not bad.any(), (f"{int(bad.sum())} of {bad.size} outside the tolerance; worst "
                           f"excess {float((err - tol[~over]).max()):.3g}")


def capture_cuda_graph(fn):
    """(graph, fn's output) of fn captured in a CUDA graph, after one warm-up call on a
    side stream (whatever allocates on the first call does so outside the capture)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out
