"""What every stage does with a set of implementations on one layer: warm
them up, time the trials, and turn the raw samples into the records the
report and the JSON show."""

from __future__ import annotations

from .impls import Impl, role
from .shapes import Shape
from .timing import run_trials, summarize, warm_up


def time_impls(ctx, impls: dict[str, Impl], check):
    """Warm every implementation up, then time the trials of those that ran:
    (warm-up records, trial records, run orders)."""
    cfg = ctx.cfg
    warm = warm_up(impls, check, ctx.backend.timer)
    raw, orders = run_trials(impls, trials=cfg.trials, runs=cfg.runs, timer=ctx.backend.timer,
                             rng=ctx.rng, check=check, progress=ctx.bar,
                             skip={n for n, w in warm.items() if w["error"]})
    return warm, raw, orders


def outcome(warm: dict, raw: dict) -> tuple[str | None, list, list[str], bool | None]:
    """(error, mismatches per trial, notes, passed) of one implementation's
    warm-up record and trial record.

    passed is None when nothing was checked (an error before any result),
    else True only when the warm-up and every trial passed the check.
    """
    error = warm["error"] or raw["error"]
    mism = list(raw["mismatches"])
    notes = raw["notes"] + ([warm["note"]] if warm["note"] else [])
    passed = None if error is not None else not any(mism) and not warm["mismatches"]
    return error, mism, sorted(set(notes)), passed


def records(impls: dict[str, Impl], warm: dict, raw: dict, bytes_: int, copy_gbps,
            registered: dict) -> dict[str, dict]:
    """Per implementation: raw samples, statistics, GB/s, % of copy, bit-exactness
    (outcome's passed: True only when the warm-up and every trial matched the
    reference)."""
    recs = {}
    for name, impl in impls.items():
        r, w = raw[name], warm[name]
        error, mism, notes, bitexact = outcome(w, r)
        stats = summarize(r["samples_us"])
        median = stats.get("median_us")
        gbps = bytes_ / (median * 1e3) if median else None
        recs[name] = {
            "role": role(name, registered),
            "ours": impl.ours,
            "call": impl.note,
            "warmup": w,
            "samples_us": r["samples_us"],
            "mismatches": mism,
            "notes": notes,
            "error": error,
            "stats": stats,
            "gbps": gbps,
            "pct_copy": (100.0 * gbps / copy_gbps) if gbps and copy_gbps else None,
            "bitexact": bitexact,
        }
    return recs


def cache_matches(ctx, **fields) -> list[dict]:
    """The autotune cache's entries for the run's kind of device and this
    build's kernels whose `fields` have the values given; [] when the cache
    cannot be read."""
    from .. import build_info, cache_entries

    try:
        entries = cache_entries()
        gen = build_info()["kernel_generations"][ctx.kind]  # the entries this build uses
    except Exception:
        return []
    cpu = ctx.kind == "cpu"
    return [e for e in entries
            if e.get("gen") == gen and str(e.get("device", "")).startswith("cpu") == cpu
            and all(e.get(k) == v for k, v in fields.items())]


def smart_pick(ctx, shape: Shape) -> dict | None:
    """The autotune cache entry smart_dequantize uses for this layer, if any."""
    dtype = ctx.cfg.dtype
    match = cache_matches(ctx, op="dequantize", K=shape.K, N=shape.N, G=shape.G,
                          scales_dtype=dtype, out_dtype=dtype)
    return dict(match[-1]) if match else None
