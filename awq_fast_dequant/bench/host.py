"""Host overhead (CUDA): microseconds of host time per call, measured while
the GPU is kept busy so that no call waits on the device, against the floor
of an empty kernel launched the way dequantize launches."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

from . import _dev
from .cases import make_inputs
from .env import safe
from .impls import torch_dequantize
from .shapes import Shape
from .timing import error_text

# Calls per repeat stay well under the launch queue's depth (about a thousand
# kernels): ours launch one kernel per call, the torch baseline about ten.
HOST_CALLS_OURS = 200
HOST_CALLS_TORCH = 40
# torch.cuda._sleep cycles: ~100 ms at 2 GHz, far longer than the timed calls.
HOST_SLEEP_CYCLES = 200_000_000

HOST_FLOOR_CASE = "empty kernel launch (floor)"
# The cases, in this order (measure_host builds them). The linear ones take x
# of one row (M = 1, the decode step) on the same layer.
HOST_CASES = (HOST_FLOOR_CASE, "dequantize(out=out)", "dequantize() allocating",
              "smart_dequantize(out=out) cache hit", "linear(out=out) fused, M=1",
              "linear(out=out) auto, M=1 cache hit", "torch baseline (allocating)")


def _keep_gpu_busy(torch, device, cycles: int) -> None:
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None:
        sleep(int(cycles))
        return
    # No _sleep in this torch: queue matrix products instead (~ cycles / 2e9 s).
    a = torch.randn(4096, 4096, device=device, dtype=torch.float16)
    for _ in range(max(1, int(cycles // 2e8))):
        a = a @ a * 0.0001


def host_overhead(torch, device, cases: dict[str, tuple[Callable[[], Any], int]], *,
                  repeats: int, sleep_cycles: int, progress=None) -> dict:
    """Host microseconds per call of each case, the GPU kept busy.

    Every case is warmed up first (allocator, tuning, lazy init).  Then, for
    each repeat, the cases take turns in a rotating order (so that no case
    always runs first, on a colder CPU): synchronize, enqueue
    torch.cuda._sleep(sleep_cycles) and an event behind it, time `calls`
    calls with perf_counter_ns, then ask the event whether the GPU was still
    sleeping.  Only then is no call waiting on the device; a repeat where the
    GPU went idle is retried with a longer sleep, and kept but marked when it
    stays idle.  `cases` maps name -> (fn, calls); calls stay well below the
    launch queue's depth (about a thousand kernels), or the host would block.
    """
    names = list(cases)
    out = {name: {"calls": cases[name][1], "samples_us_per_call": [], "gpu_busy": [],
                  "sleep_cycles": [], "error": None, "attempts": 3} for name in names}

    def fail(name, exc):
        out[name]["error"] = error_text(exc)
        try:
            torch.cuda.synchronize(device)
        except Exception:
            pass

    for name in names:
        try:
            for _ in range(3):
                cases[name][0]()
            torch.cuda.synchronize(device)
        except Exception as exc:
            fail(name, exc)

    for rep in range(repeats):
        for i in range(len(names)):
            name = names[(i + rep) % len(names)]
            entry = out[name]
            if entry["error"] is not None:
                continue
            fn, calls = cases[name]
            cycles = sleep_cycles
            try:
                for _attempt in range(entry["attempts"]):
                    torch.cuda.synchronize(device)
                    _keep_gpu_busy(torch, device, cycles)
                    busy = torch.cuda.Event()
                    busy.record()
                    t0 = time.perf_counter_ns()
                    for _ in range(calls):
                        fn()
                    t1 = time.perf_counter_ns()
                    still_busy = not busy.query()
                    torch.cuda.synchronize(device)
                    if still_busy:
                        break
                    cycles *= 4
                else:
                    # Longer sleeps did not help: the calls themselves wait on the
                    # device (a synchronizing op). Keep measuring, without retries.
                    entry["attempts"] = 1
            except Exception as exc:
                fail(name, exc)
                continue
            entry["samples_us_per_call"].append((t1 - t0) / 1000.0 / calls)
            entry["gpu_busy"].append(still_busy)
            entry["sleep_cycles"].append(cycles)

    for name in names:
        entry = out[name]
        del entry["attempts"]
        samples = entry["samples_us_per_call"]
        entry["median_us"] = statistics.median(samples) if samples else None
        entry["min_us"] = min(samples) if samples else None
        entry["all_busy"] = bool(samples) and all(entry["gpu_busy"])
        if progress is not None:
            progress.update(1)
    return out


def measure_host(ctx) -> dict:
    """The host-overhead record of the run: every case of HOST_CASES on
    --host-shape, with the cache statistics around it."""
    from .. import cache_stats, dequantize, linear, smart_dequantize

    torch, cfg = ctx.torch, ctx.cfg
    K, N = cfg.host_kn
    G = cfg.group if K % cfg.group == 0 else K
    dtype = cfg.dtype
    ctx.bar.set_description_str(f"host overhead {K}x{N}")
    case = ctx.backend.case(Shape("host", K, N, G), dtype, make_inputs(K, N, G, dtype, cfg.seed))
    qw, qz, sc, out = case.qweight, case.qzeros, case.scales, case.out
    dt = getattr(torch, dtype)
    x = torch.randn(1, K, device=qw.device).to(dt)
    y = torch.empty(1, N, dtype=dt, device=qw.device)
    dev_index = qw.device.index
    stream = torch.cuda.current_stream(qw.device).cuda_stream
    empty_launch = _dev.empty_launch
    # The floor first: an empty kernel launched the way dequantize launches, with
    # no arguments to read. Each case's distance from it is its own host work.
    cases = dict(zip(HOST_CASES, (
        (lambda: empty_launch(dev_index, stream), HOST_CALLS_OURS),
        (lambda: dequantize(qw, qz, sc, group_size=G, out=out), HOST_CALLS_OURS),
        (lambda: dequantize(qw, qz, sc, group_size=G), HOST_CALLS_OURS),
        (lambda: smart_dequantize(qw, qz, sc, group_size=G, out=out), HOST_CALLS_OURS),
        (lambda: linear(x, qw, qz, sc, group_size=G, out=y, path="fused"), HOST_CALLS_OURS),
        (lambda: linear(x, qw, qz, sc, group_size=G, out=y), HOST_CALLS_OURS),
        (lambda: torch_dequantize(qw, qz, sc, G, dt), HOST_CALLS_TORCH),
    )))
    before = safe(cache_stats)
    measured = host_overhead(torch, ctx.backend.device, cases, repeats=cfg.host_repeats,
                             sleep_cycles=HOST_SLEEP_CYCLES, progress=ctx.bar)
    after = safe(cache_stats)
    del case, x, y
    ctx.backend.release()
    return {"label": f"{K}x{N}", "K": K, "N": N, "G": G, "dtype": dtype,
            "method": "calls timed with perf_counter_ns while torch.cuda._sleep keeps the "
                      "GPU busy; median over repeats",
            "cases": measured, "cache_stats_before": before, "cache_stats_after": after}


def above_floor(host: dict, name: str):
    """Median over repeats of (case - floor) in microseconds per call: each
    repeat times every case within a few milliseconds, so the difference
    cancels what the machine does to all of them at once.  None when the
    floor is missing or the repeats do not pair up."""
    cases = host.get("cases", {})
    floor = cases.get(HOST_FLOOR_CASE, {}).get("samples_us_per_call") or []
    mine = cases.get(name, {}).get("samples_us_per_call") or []
    if name == HOST_FLOOR_CASE or not floor or len(floor) != len(mine):
        return None
    return statistics.median(a - b for a, b in zip(mine, floor))
