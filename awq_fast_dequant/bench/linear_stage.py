"""The linear stage (--linear): per layer, dtype and M, the rows fused, auto,
dequant+matmul and dense timed and checked within the tolerance, the
dispatcher's choice read from the autotune cache; then, once the run's copy
bandwidth and launch floor are known, each row's figures against the floor
model and the dense matmul."""

from __future__ import annotations

import time

from .linear_check import ToleranceCheck, check_rows
from .linear_data import DENSE, OURS, ROWS, NumpyFlavour, TorchFlavour, build_rows, w_bytes
from .linear_model import (PEAK_FLOPS, crossover, floor_model_us, linear_bytes, linear_flops,
                           m_bucket, packed_bytes, row_figures)
from .measure import cache_matches, outcome
from .timing import cpu_copy_bandwidth, error_text, run_trials, summarize, warm_up

METHOD = ("per layer, dtype and M: every row timed like the dequantize benchmark (trials in a "
          "random order, cold caches, one call per timing) and checked against a float64 "
          "reference of rows of y: |y - y64| <= 2^-9 (|x| @ |W|) + 1 ulp of y's dtype")

# Untimed calls before the trials: the first tunes the M bucket (auto and
# fused), the second is a cache hit with warm allocator and handles. One on
# the CPU, which has no allocator or handles to warm and where calls are long.
WARM_CALLS = {"cuda": 2, "cpu": 1}


def make_flavour(ctx):
    """The framework the run's device is driven through."""
    if ctx.kind == "cuda":
        return TorchFlavour(ctx.torch, ctx.backend.device)
    return NumpyFlavour()


def steps(ctx) -> int:
    """Trials of the linear stage, for the progress total."""
    cfg = ctx.cfg
    rows = len(ROWS) + len([n for n in ctx.registered if n not in ROWS])
    return len(cfg.shapes) * len(cfg.dtypes) * len(cfg.linear_m) * cfg.trials * rows


def dispatcher_choice(ctx, K: int, N: int, G: int, dtype: str, M: int) -> dict | None:
    """The autotune cache's linear entry for this layer and M bucket (what
    linear(path="auto") runs), or None when nothing is tuned."""
    match = cache_matches(ctx, op="linear", K=K, N=N, G=G, M=m_bucket(M), scales_dtype=dtype)
    if ctx.kind == "cuda" and len(match) > 1:
        # Entries of several GPU models: the one of this device ("NAME sm_XY").
        name = ctx.torch.cuda.get_device_name(ctx.backend.device)
        match = [e for e in match if str(e.get("device", "")).startswith(name)] or match
    return dict(match[-1]) if match else None


def _record(impl, warm: dict, raw: dict, registered: dict) -> dict:
    error, outside, notes, within = outcome(warm, raw)
    return {
        "role": "registered" if impl.name in registered else (
            "baseline" if impl.name == DENSE else "ours"),
        "ours": impl.ours,
        "call": impl.note,
        "warmup": warm,
        "samples_us": raw["samples_us"],
        "outside": outside,
        "notes": notes,
        "error": error,
        "stats": summarize(raw["samples_us"]),
        "within_tolerance": within,
    }


def run_point(ctx, flavour, layer, shape, M: int) -> dict:
    """One (layer, dtype, M): the rows timed and checked, the choice of auto."""
    cfg, timer = ctx.cfg, ctx.backend.timer
    ctx.bar.set_description_str(f"{shape.model} {shape.label} {layer.dtype} M={M}")
    case = flavour.case(layer, M, cfg.seed)
    rows = check_rows(M, cfg.seed)
    check = ToleranceCheck(*flavour.reference(layer, case, rows), rows, M, layer.N)
    impls = build_rows(flavour, layer, case, ctx.registered)
    warm = warm_up(impls, check, timer, calls=WARM_CALLS[ctx.kind])
    probe = {}
    for name in ("fused", "auto"):
        if warm[name]["error"] is None:
            try:
                probe[name] = flavour.materializes_w(impls[name].fn, w_bytes(layer))
            except Exception as exc:  # a probe never stops the run
                probe[name] = error_text(exc)
    raw, orders = run_trials(impls, trials=cfg.trials, runs=cfg.runs, timer=timer, rng=ctx.rng,
                             check=check, progress=ctx.bar,
                             skip={n for n, w in warm.items() if w["error"]})
    recs = {name: _record(impls[name], warm[name], raw[name], ctx.registered) for name in impls}
    for name, value in probe.items():
        recs[name]["materializes_w"] = value
    point = {
        "M": M, "bucket": m_bucket(M), "rows_checked": [int(r) for r in rows],
        "bytes": linear_bytes(M, layer.K, layer.N, layer.G, layer.dtype),
        "flops": linear_flops(M, layer.K, layer.N),
        "auto_choice": dispatcher_choice(ctx, layer.K, layer.N, layer.G, layer.dtype, M),
        "orders": orders, "impls": recs,
    }
    for name, rec in recs.items():
        where = f"{shape.label} {layer.dtype} M={M}: {name}"
        if rec["error"]:
            ctx.say(f"{where}: {rec['error']}")
        elif rec["within_tolerance"] is False:
            ctx.say(f"{where}: outside the tolerance ({'; '.join(rec['notes'])})")
    del case, check, impls
    return point


def run_layer(ctx, flavour, shape, dtype: str) -> dict:
    """Every M of one layer and dtype; a layer that cannot be set up is
    recorded with its error (its trials are counted as done)."""
    cfg = ctx.cfg
    entry = {"model": shape.model, "label": shape.label, "K": shape.K, "N": shape.N,
             "G": shape.G, "dtype": dtype, "packed_bytes": packed_bytes(shape.K, shape.N, shape.G, dtype),
             "error": None, "points": []}
    ctx.bar.set_description_str(f"{shape.model} {shape.label} {dtype}: reference")
    t0 = time.perf_counter()
    try:
        layer = flavour.layer(shape, dtype, cfg.seed)
    except Exception as exc:
        entry["error"] = error_text(exc)
        ctx.say(f"{shape.label} {dtype}: {entry['error']}")
        ctx.bar.update(steps(ctx) // (len(cfg.shapes) * len(cfg.dtypes)))
        return entry
    entry["reference_s"] = time.perf_counter() - t0
    for M in cfg.linear_m:
        try:
            entry["points"].append(run_point(ctx, flavour, layer, shape, M))
        except Exception as exc:  # x or the reference could not be built
            entry["error"] = f"M={M}: {error_text(exc)}"
            ctx.say(f"{shape.label} {dtype}: {entry['error']}")
            break
    entry["crossover_M"] = crossover(entry["points"])
    del layer
    return entry


def run_linear(ctx) -> None:
    """The stage: result["linear"] filled with every layer, dtype and M."""
    cfg = ctx.cfg
    lin = {"method": METHOD, "M": list(cfg.linear_m), "dtypes": list(cfg.dtypes),
           "peak_flops": {d: PEAK_FLOPS[d] for d in cfg.dtypes} if ctx.kind == "cuda" else None,
           "copy": None, "rows": list(ROWS), "ours": list(OURS), "layers": []}
    ctx.result["linear"] = lin
    if ctx.kind == "cpu":
        ctx.bar.set_description_str("np.copyto rate")
        nbytes = cfg.copy_mib << 20
        copy = cpu_copy_bandwidth(nbytes, ctx.backend.timer, runs=5)
        copy["method"] = "np.copyto(dst, src) of a large array after a memset, perf_counter"
        # The CPU target compares with the bytes copied per second (one way).
        copy["copied_gbps"] = nbytes / (copy["median_us"] * 1e3)
        lin["copy"] = copy
    flavour = make_flavour(ctx)
    lin["framework"] = flavour.name
    for shape in cfg.shapes:
        for dtype in cfg.dtypes:
            lin["layers"].append(run_layer(ctx, flavour, shape, dtype))
            ctx.backend.release()


def apply_figures(result: dict) -> None:
    """Every row's figures, once the run's copy bandwidth (CUDA: the median of
    the start and end measurements) and launch floor are known."""
    lin = result.get("linear")
    if not lin:
        return
    cuda = result["config"]["device"] != "cpu"
    copy_gbps = (result.get("copy_bandwidth") or {}).get("gbps") if cuda else None
    launch = (result.get("launch_floor") or {}).get("median_us") if cuda else None
    copied = (lin.get("copy") or {}).get("copied_gbps")
    lin["copy_gbps"] = copy_gbps
    lin["launch_floor_us"] = launch
    for layer in lin["layers"]:
        for p in layer["points"]:
            floor = None
            if copy_gbps and launch:
                floor = floor_model_us(launch, copy_gbps, p["bytes"], p["flops"],
                                       PEAK_FLOPS[layer["dtype"]])
            p["floor_model_us"] = floor
            dense_us = (p["impls"].get(DENSE, {}).get("stats") or {}).get("median_us")
            for rec in p["impls"].values():
                rec.update(row_figures(rec["stats"].get("median_us"), nbytes=p["bytes"],
                                       flops=p["flops"], floor_us=floor, dense_us=dense_us,
                                       packed=layer["packed_bytes"], copy_rate_gbps=copied))
            p["flagged"] = any(r["stats"].get("unstable") for r in p["impls"].values())

