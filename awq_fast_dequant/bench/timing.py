"""How the benchmark times (DESIGN.md section 6).

- `CudaTimer` times one launch between a pair of CUDA events, after writing
  a buffer larger than twice the L2 cache so that every timed launch starts
  cold; `CpuTimer` does the same with time.perf_counter_ns and a memset.
- `run_trials` runs T trials of R timed runs, the implementations in a fresh
  random order each trial, and checks each trial's result bit for bit.
- `summarize` gives median, mean and the >15% median/mean flag.
- Copy bandwidth: the roofline's ceiling, measured in the same run.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import numpy as np

# A shape is flagged when |mean - median| / median exceeds this (DESIGN.md section 6).
UNSTABLE_GAP = 0.15


class CudaTimer:
    """Times fn() between CUDA events on the current stream, L2 flushed first."""

    def __init__(self, torch, device, flush_bytes: int):
        self.torch = torch
        self.device = device
        self.flush_bytes = int(flush_bytes)
        # Written with zero_() before each timed launch: a plain memset kernel
        # that pushes everything else out of L2 (it is >= 2x the L2 size).
        self.flush = torch.empty(self.flush_bytes, dtype=torch.uint8, device=device)
        self._events: list = []

    def _pairs(self, n: int):
        Event = self.torch.cuda.Event
        while len(self._events) < n:
            self._events.append((Event(enable_timing=True), Event(enable_timing=True)))
        return self._events[:n]

    def run(self, fn: Callable[[], Any], runs: int) -> tuple[list[float], Any]:
        """R timed launches of fn; (microseconds of each, the last result)."""
        pairs = self._pairs(runs)
        result = None
        for start, stop in pairs:
            self.flush.zero_()
            start.record()
            result = fn()
            stop.record()
        # Raises here if a launch failed asynchronously.
        self.torch.cuda.synchronize(self.device)
        # Events resolve about half a microsecond: 4 decimals keep everything.
        return [round(start.elapsed_time(stop) * 1000.0, 4) for start, stop in pairs], result

    def sync(self) -> None:
        self.torch.cuda.synchronize(self.device)


class CpuTimer:
    """Times fn() with perf_counter_ns after a memset of a large buffer."""

    def __init__(self, flush_bytes: int):
        self.flush_bytes = int(flush_bytes)
        self.flush = np.empty(self.flush_bytes, dtype=np.uint8)

    def run(self, fn: Callable[[], Any], runs: int) -> tuple[list[float], Any]:
        samples = []
        result = None
        for _ in range(runs):
            self.flush.fill(0)
            t0 = time.perf_counter_ns()
            result = fn()
            t1 = time.perf_counter_ns()
            samples.append((t1 - t0) / 1000.0)  # integer ns: exact in 3 decimals
        return samples, result

    def sync(self) -> None:
        pass


def error_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) < 500 else text[:497] + "..."


def warm_up(impls: dict, check, timer, calls: int = 2) -> dict[str, dict]:
    """Call every implementation `calls` times untimed (module load, tuning of
    smart_dequantize, allocator warm-up) and check the last result.

    Returns name -> {"error": str|None, "mismatches": int, "note": str|None}.
    """
    status = {}
    for name, impl in impls.items():
        entry = {"error": None, "mismatches": 0, "note": None}
        try:
            if impl.poison is not None:
                impl.poison()
            result = None
            for _ in range(calls):
                result = impl.fn()
            timer.sync()
            if check is not None:
                entry["mismatches"], entry["note"] = check(result)
        except Exception as exc:  # recorded and reported, never fatal
            entry["error"] = error_text(exc)
            try:
                timer.sync()
            except Exception:
                pass
        status[name] = entry
    return status


def run_trials(impls: dict, *, trials: int, runs: int, timer, rng: np.random.Generator,
               check=None, progress=None, skip: set | None = None) -> tuple[dict, list]:
    """T trials x R timed runs; implementations in a fresh random order each trial.

    `check(result) -> (mismatches, note)` runs on the last result of every
    trial (the shared `out` is poisoned before the trial's first run, so an
    element no run wrote is caught). Returns (name -> raw record, orders),
    orders[t] being the order of trial t. An implementation that raises is
    recorded with its error and left out of later trials.
    """
    names = list(impls)
    skip = set(skip or ())
    raw = {name: {"samples_us": [], "mismatches": [], "notes": [], "error": None} for name in names}
    orders = []
    for _ in range(trials):
        order = [names[i] for i in rng.permutation(len(names))]
        orders.append(order)
        for name in order:
            record = raw[name]
            if progress is not None:
                progress.update(1)
            if name in skip or record["error"] is not None:
                continue
            impl = impls[name]
            try:
                if impl.poison is not None:
                    impl.poison()
                samples, result = timer.run(impl.fn, runs)
                mismatches, note = check(result) if check is not None else (0, None)
                del result
            except Exception as exc:
                record["error"] = error_text(exc)
                try:
                    timer.sync()
                except Exception:
                    pass
                continue
            record["samples_us"].append(samples)
            record["mismatches"].append(mismatches)
            if note:
                record["notes"].append(note)
    return raw, orders


def summarize(samples: list[list[float]]) -> dict:
    """Median, mean, spread and the median/mean flag of T x R samples."""
    flat = [x for trial in samples for x in trial]
    if not flat:
        return {"n": 0, "median_us": None, "mean_us": None, "unstable": False}
    median = statistics.median(flat)
    mean = statistics.fmean(flat)
    gap = abs(mean - median) / median if median > 0 else 0.0
    return {
        "n": len(flat),
        "median_us": median,
        "mean_us": mean,
        "min_us": min(flat),
        "max_us": max(flat),
        "stdev_us": statistics.stdev(flat) if len(flat) > 1 else 0.0,
        "trial_medians_us": [statistics.median(t) for t in samples if t],
        "mean_median_gap": gap,
        "unstable": gap > UNSTABLE_GAP,
    }


# --------------------------------------------------------------------------
# Copy bandwidth: the ceiling GB/s is compared with
# --------------------------------------------------------------------------


def cuda_copy_bandwidth(torch, device, timer: CudaTimer, nbytes: int, runs: int) -> dict:
    """Device-to-device copy of `nbytes` (dst.copy_(src)), cold L2, median of
    `runs`; bytes counted = read + written."""
    free = torch.cuda.mem_get_info(device)[0]
    nbytes = int(min(nbytes, max(free // 4, 64 << 20)))
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up
    samples, _ = timer.run(lambda d=dst, s=src: d.copy_(s), runs)
    ok = bool(torch.equal(dst, src))
    del src, dst  # 2 x nbytes of device memory
    return _copy_result("dst.copy_(src) on the device, L2 flushed before each, CUDA events",
                        nbytes, samples, copy_correct=ok)


def cpu_copy_bandwidth(nbytes: int, timer: CpuTimer, runs: int) -> dict:
    """np.copyto of an `nbytes` array after a memset, median of `runs`;
    bytes counted = read + written."""
    nbytes = max(int(nbytes), 1)
    src = np.random.default_rng(1).integers(0, 256, size=nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    samples, _ = timer.run(lambda: np.copyto(dst, src), runs)
    return _copy_result("np.copyto(dst, src) of an output-sized array, after a memset, "
                        "perf_counter", nbytes, samples)


def _copy_result(method: str, nbytes: int, samples: list, **extra) -> dict:
    """The record of a copy measurement; bytes moved = read + written."""
    median = statistics.median(samples)
    return {
        "method": method,
        "buffer_bytes": nbytes,
        "bytes_moved": 2 * nbytes,
        "samples_us": samples,
        "median_us": median,
        "gbps": 2 * nbytes / (median * 1e3) if median > 0 else None,
        **extra,
    }
