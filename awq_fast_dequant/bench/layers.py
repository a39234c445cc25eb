"""The main stage: per layer shape, every implementation timed and checked
(the main table). `prepare` builds what every per-shape stage shares."""

from __future__ import annotations

import time

from .cases import make_inputs
from .impls import build_impls
from .measure import records, smart_pick, time_impls
from .roofline import cpu_copy
from .shapes import Shape, bytes_moved


def prepare(ctx, shape: Shape, copy_gbps):
    """The shape's result entry (appended to the result), its Case on the
    device, and the reference check (None when no stage checks results)."""
    cfg = ctx.cfg
    entry = {"model": shape.model, "label": shape.label, "K": shape.K, "N": shape.N,
             "G": shape.G, "dtype": cfg.dtype,
             "bytes": bytes_moved(shape.K, shape.N, shape.G, cfg.dtype)}
    ctx.result["shapes"].append(entry)
    ctx.bar.set_description_str(f"{shape.model} {shape.label}: reference")
    inputs = make_inputs(shape.K, shape.N, shape.G, cfg.dtype, cfg.seed)
    case = ctx.backend.case(shape, cfg.dtype, inputs)
    check = None
    if cfg.main or (ctx.kind == "cuda" and cfg.sweep):
        from .. import reference

        t0 = time.perf_counter()
        ref = reference.dequantize(*inputs, group_size=shape.G)
        entry["reference_s"] = time.perf_counter() - t0
        check = ctx.backend.check(ref, cfg.dtype)
        del ref
    del inputs
    if ctx.kind == "cpu":
        entry["copy_bandwidth"] = cpu_copy(ctx, shape)
        copy_gbps = entry["copy_bandwidth"]["gbps"]
    entry["copy_gbps"] = copy_gbps
    return entry, case, check


def time_layer(ctx, shape: Shape, case, check, entry: dict) -> None:
    """Every implementation of the main table on this layer, into `entry`."""
    ctx.bar.set_description_str(f"{shape.model} {shape.label}")
    impls = build_impls(case, ctx.impl_names(), poison=ctx.backend.poison(case),
                        peers=ctx.peers, registered=ctx.registered)
    warm, raw, orders = time_impls(ctx, impls, check)
    entry["orders"] = orders
    entry["implementations"] = records(impls, warm, raw, entry["bytes"], entry["copy_gbps"],
                                       ctx.registered)
    entry["flagged"] = any((r["stats"] or {}).get("unstable")
                           for r in entry["implementations"].values())
    entry["smart_pick"] = smart_pick(ctx, shape)
    for name, rec in entry["implementations"].items():
        if rec["error"]:
            ctx.say(f"{shape.label}: {name}: {rec['error']}")
        elif rec["bitexact"] is False:
            ctx.say(f"{shape.label}: {name}: not bit-exact")
