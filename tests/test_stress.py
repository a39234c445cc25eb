"""Resource hygiene and concurrency: no reference or memory growth over many
calls (including failing ones), correct results from concurrent threads, and
the GIL released while the CPU computes."""

import gc
import sys
import threading

import numpy as np
import pytest

import awq_fast_dequant as awq
from awq_fast_dequant import reference

from conftest import make_problem, run_threads


def _rss_kib():
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    import resource
    return pages * resource.getpagesize() // 1024


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_no_leaks_over_10000_calls(rng):
    qw, qz, sc = make_problem(rng, 64, 64, 32)
    out = np.empty((64, 64), np.float16)
    bad_out = np.empty((64, 64), np.float32)
    objs = (qw, qz, sc, out, bad_out)

    def run(n):
        for _ in range(n):
            awq.dequantize(qw, qz, sc, out=out)
            awq.dequantize(qw, qz, sc)  # allocating
            try:
                awq.dequantize(qw, qz, sc, out=bad_out)  # rejected
            except TypeError:
                pass

    run(200)
    gc.collect()
    refs = [sys.getrefcount(o) for o in objs]
    rss = _rss_kib()
    run(10_000)
    gc.collect()
    assert [sys.getrefcount(o) for o in objs] == refs
    grown = _rss_kib() - rss
    # 30,000 calls; a leak of even one 8 KiB output per call would be ~80 MB
    assert grown < 4096, f"RSS grew by {grown} KiB"


def test_no_leaks_through_dlpack(rng):
    torch = pytest.importorskip("torch")
    qw, qz, sc = make_problem(rng, 64, 64, 32)
    t = [torch.from_numpy(a) for a in (qw, qz, sc)]
    for _ in range(100):
        awq.dequantize(*t)
    gc.collect()
    refs = [sys.getrefcount(x) for x in t]
    rss = _rss_kib()
    for _ in range(10_000):
        awq.dequantize(*t)
    gc.collect()
    assert [sys.getrefcount(x) for x in t] == refs
    assert _rss_kib() - rss < 4096


def test_four_threads_each_get_their_own_result(rng):
    """Four threads released together, 20 calls each on their own problem:
    every result is right (no state shared between concurrent calls)."""
    problems = [make_problem(rng, 512, 1024, 128) for _ in range(4)]
    expected = [reference.dequantize(*p) for p in problems]
    outs = [np.empty((512, 1024), np.float16) for _ in range(4)]

    def worker(i):
        for _ in range(20):
            awq.dequantize(*problems[i], out=outs[i])
            reference.assert_bitexact(outs[i], expected[i])

    errors = run_threads(4, worker)
    assert not errors, errors


def test_the_gil_is_released_during_cpu_work(rng):
    """Another Python thread runs while dequantize computes on the CPU.

    With the switch interval made huge the interpreter never takes the GIL from
    a thread on its own, so a woken thread can run Python code only while the
    caller is inside a call that releases the GIL. The caller wakes the thread
    and then calls dequantize; it checks whether the thread ran before it does
    anything else that could release the GIL. A call that held the GIL would
    never let it run."""
    qw, qz, sc = make_problem(rng, 1024, 4096, 128)
    out = np.empty((1024, 4096), np.float16)
    woken, ran, done = threading.Event(), [], threading.Event()

    def other():
        woken.wait()
        ran.append(True)
        done.set()

    thread = threading.Thread(target=other)
    interval = sys.getswitchinterval()
    thread.start()
    sys.setswitchinterval(1000.0)
    try:
        ran_during_a_call = False
        for _ in range(50):  # the OS may be slow to schedule the thread: a few tries
            woken.set()
            awq.dequantize(qw, qz, sc, out=out)
            ran_during_a_call = bool(ran)
            if ran_during_a_call:
                break
    finally:
        sys.setswitchinterval(interval)
        woken.set()
        done.wait(timeout=60)
        thread.join(timeout=60)
    assert ran_during_a_call, "no other thread ran during 50 dequantize calls on the CPU"
