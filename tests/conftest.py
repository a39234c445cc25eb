"""Shared helpers: random AWQ problems (NumPy and torch), the hand-worked packed word,
dtype plumbing, child processes, threads; and a summary of why tests were skipped."""

import collections
import os
import re
import threading

import numpy as np
import pytest

import awq_fast_dequant as awq
from awq_fast_dequant._frameworks import numpy_dtype

DTYPES = ("float16", "bfloat16", "float32")

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
