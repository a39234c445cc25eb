"""One run of the benchmark, from the command line to the report: the stages
in their order, the progress total, and what is written at the end."""

from __future__ import annotations

import os
import sys
import traceback

from . import linear_stage, roofline
from .cli import build_parser, resolve
from .context import Context, new_result, open_context
from .host import HOST_CASES, measure_host
from .impls import registered_impls, registered_linear_impls
from .layers import prepare, time_layer
from .plots import write_plots
from .prefill import CALLS as PREFILL_CALLS, prefill_layer
from .progress import make_progress
from .report import print_report, write_json
from .sweep import steps as sweep_steps, sweep_layer
from .targets import evaluate
from .verdict import finish


def total_steps(ctx: Context) -> int:
    """Trials of all the stages the run will make, for the progress total."""
    cfg = ctx.cfg
    per_shape = cfg.trials * len(ctx.impl_names()) if cfg.main else 0
    if ctx.kind == "cuda":
        if cfg.sweep:
            per_shape += cfg.trials * sweep_steps()
        if cfg.prefill:
            per_shape += cfg.trials * len(PREFILL_CALLS) * len(cfg.prefill_tokens)
    steps = per_shape * len(cfg.shapes)
    if cfg.linear:
        steps += linear_stage.steps(ctx)
    if ctx.kind == "cuda":
        steps += 2  # copy bandwidth, start and end
        if roofline.wants_floor(cfg):
            steps += cfg.trials
        if cfg.host:
            steps += len(HOST_CASES)
    return steps


def run_shape(ctx: Context, shape, copy_gbps) -> None:
    """Every stage asked for on one layer; its device memory is released after."""
    cfg = ctx.cfg
    entry, case, check = prepare(ctx, shape, copy_gbps)
    if cfg.main:
        time_layer(ctx, shape, case, check, entry)
    if ctx.kind == "cuda" and cfg.sweep:
        entry["sweep"] = sweep_layer(ctx, shape, case, check, entry)
    if ctx.kind == "cuda" and cfg.prefill:
        entry["prefill"] = prefill_layer(ctx, shape, case)
    del case, check
    ctx.backend.release()


def execute(ctx: Context) -> int:
    """The stages in order; returns the exit status.

    On CUDA the copy bandwidth is measured at the start and at the end of the
    run, and the run's figure is the median of both, so that drift over the
    run weighs on the ceiling as it does on the layers.
    """
    cfg, result = ctx.cfg, ctx.result
    copy_gbps = None
    if ctx.kind == "cuda":
        first = roofline.cuda_copy(ctx, "start")
        result["copy_bandwidth"] = {"measurements": [first]}
        copy_gbps = first["gbps"]
        if roofline.wants_floor(cfg):
            result["launch_floor"] = roofline.launch_floor(ctx)
    if cfg.linear:
        linear_stage.run_linear(ctx)
    else:
        for shape in cfg.shapes:
            run_shape(ctx, shape, copy_gbps)
    if ctx.kind == "cuda":
        if cfg.host:
            result["host_overhead"] = measure_host(ctx)
        result["copy_bandwidth"]["measurements"].append(roofline.cuda_copy(ctx, "end"))
        roofline.apply_cuda_copy(result)
    else:
        result["host_overhead"] = {"skipped": "CUDA only", "cases": {}}
        if cfg.sweep:
            ctx.say("sweep: skipped (CUDA only)")
        if cfg.prefill:
            ctx.say("prefill: skipped (CUDA only)")
    if cfg.linear:
        linear_stage.apply_figures(result)
        result["verdict"] = evaluate(result)
    result["complete"] = True
    return finish(result)


def _measure(cfg, bar, result: dict, registered: dict) -> int:
    """Set up and run every stage; the progress display is closed however it ends."""
    try:
        ctx = open_context(cfg, bar, result, registered)
        bar.set_total(total_steps(ctx))
        return execute(ctx)
    finally:
        bar.close()


def _write_outputs(result: dict, cfg) -> None:
    if cfg.plot:
        try:
            paths, reason = write_plots(result, cfg.plot)
        except Exception as exc:  # a plot must never lose the measurements
            paths, reason = [], f"plots failed: {type(exc).__name__}: {exc}"
        result["plots"] = paths
        if reason:
            print(reason, file=sys.stderr)
            result["plots_note"] = reason
    print_report(result)
    if cfg.json_path:
        write_json(result, cfg.json_path)
        print(f"\nJSON: {cfg.json_path}")
    if result["plots"]:
        print("plots: " + ", ".join(result["plots"]))


def main(argv: list[str] | None = None, prog: str = "awq-fast-dequant bench") -> int:
    """Entry point of `python -m awq_fast_dequant bench ARGS` (argv = ARGS).

    Returns the exit status: 0 when everything ran and every one of ours was
    bit-exact on every trial, 1 otherwise, 2 for a bad command line.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(prog)
    try:
        cfg = resolve(parser.parse_args(argv), parser)
    except SystemExit as exc:  # argparse exits on --help and on errors
        return int(exc.code or 0)

    bar = make_progress(cfg.progress)
    bar.set_description_str("setting up")
    registered = (registered_linear_impls if cfg.linear else registered_impls)(os.environ)
    result = new_result(cfg, registered)
    result["argv"] = argv
    try:
        code = _measure(cfg, bar, result, registered)
    except KeyboardInterrupt:
        result["summary"] = {"exit_code": 130, "interrupted": True}
        if cfg.json_path:
            write_json(result, cfg.json_path)
            print(f"partial results written to {cfg.json_path}", file=sys.stderr)
        raise
    except Exception:
        tb = traceback.format_exc()
        print(tb, file=sys.stderr)
        try:
            finish(result)
        except Exception:
            result["summary"] = {}
        result["summary"]["exit_code"] = 1
        result["summary"]["crash"] = tb
        code = 1
    _write_outputs(result, cfg)
    return code
