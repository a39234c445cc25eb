"""The block-size sweep (--sweep, CUDA): v3 and v4 over every block size the
public API can set, v4 with its default, and smart_dequantize, on one layer."""

from __future__ import annotations

from .impls import Impl
from .measure import records, smart_pick, time_impls
from .shapes import Shape

SWEEP_V3_BLOCKS = (64, 128, 256, 512, 1024)
SWEEP_V4_BLOCKS = (64, 128, 256, 512)
# Candidates beyond the swept blocks: v4 with its default, and smart_dequantize.
SWEEP_EXTRA = 2


def steps() -> int:
    """Candidates per trial, for the progress total."""
    return len(SWEEP_V3_BLOCKS) + len(SWEEP_V4_BLOCKS) + SWEEP_EXTRA


def _impls(case, poison) -> dict[str, Impl]:
    from .. import dequantize, smart_dequantize

    qw, qz, sc, out, G = case.qweight, case.qzeros, case.scales, case.out, case.group_size
    impls = {}
    for kernel, blocks in (("v3", SWEEP_V3_BLOCKS), ("v4", SWEEP_V4_BLOCKS)):
        for bs in blocks:
            impls[f"{kernel}/{bs}"] = Impl(
                f"{kernel}/{bs}",
                lambda k=kernel, b=bs: dequantize(qw, qz, sc, group_size=G, out=out, kernel=k,
                                                  block_size=b),
                True, poison, f"dequantize(kernel={kernel!r}, block_size={bs}, out=)")
    impls["v4/default"] = Impl(
        "v4/default", lambda: dequantize(qw, qz, sc, group_size=G, out=out, kernel="v4"),
        True, poison, "dequantize(kernel='v4', out=)")
    impls["smart"] = Impl("smart", lambda: smart_dequantize(qw, qz, sc, group_size=G, out=out),
                          True, poison, "smart_dequantize(out=)")
    return impls


def _pct_over(us, best_us):
    return 100.0 * (us - best_us) / best_us


def sweep_layer(ctx, shape: Shape, case, check, entry: dict) -> dict:
    """Every candidate timed and checked; the winner, its margins, and what
    smart_dequantize picked and measured."""
    impls = _impls(case, ctx.backend.poison(case))
    ctx.bar.set_description_str(f"{shape.model} {shape.label}: sweep")
    warm, raw, orders = time_impls(ctx, impls, check)
    cands = records(impls, warm, raw, entry["bytes"], entry["copy_gbps"], {})
    timed = sorted(((r["stats"]["median_us"], n) for n, r in cands.items()
                    if n != "smart" and r["stats"].get("median_us") and r["bitexact"]))
    out = {"candidates": cands, "orders": orders, "smart_pick": smart_pick(ctx, shape),
           "winner": None, "winner_us": None, "runner_up": None, "runner_up_us": None,
           "margin_runner_up_pct": None, "margin_v4_default_pct": None,
           "smart_us": None, "smart_vs_winner_pct": None}
    if not timed:
        return out
    best_us, best = timed[0]
    out.update(winner=best, winner_us=best_us)
    if len(timed) > 1:
        out.update(runner_up=timed[1][1], runner_up_us=timed[1][0],
                   margin_runner_up_pct=_pct_over(timed[1][0], best_us))
    default_us = cands["v4/default"]["stats"].get("median_us")
    if default_us:
        out["margin_v4_default_pct"] = _pct_over(default_us, best_us)
    smart_us = cands["smart"]["stats"].get("median_us")
    if smart_us:
        out.update(smart_us=smart_us, smart_vs_winner_pct=_pct_over(smart_us, best_us))
    return out
