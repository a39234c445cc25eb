"""What each layer's time is compared with: the copy bandwidth measured in the
same run (the roofline's ceiling), the launch floor (CUDA), and the floor
model of a layer (launch floor + its bytes at the copy bandwidth)."""

from __future__ import annotations

import statistics

from .cases import make_inputs
from .impls import Impl
from .measure import records, time_impls
from .shapes import DTYPE_BYTES, FLOOR_SHAPE, Shape, bytes_moved
from .timing import cpu_copy_bandwidth, cuda_copy_bandwidth


def cuda_copy(ctx, when: str) -> dict:
    """Device-to-device copy of --copy-mib, cold L2; `when` is "start" or "end"."""
    bw = cuda_copy_bandwidth(ctx.torch, ctx.backend.device, ctx.backend.timer,
                             ctx.cfg.copy_mib << 20, runs=10)
    bw["when"] = when
    ctx.bar.update(1)
    return bw


def cpu_copy(ctx, shape: Shape) -> dict:
    """np.copyto of an output-sized array: the CPU's ceiling for this layer."""
    nbytes = shape.K * shape.N * DTYPE_BYTES[ctx.cfg.dtype]
    return cpu_copy_bandwidth(nbytes, ctx.backend.timer, runs=max(ctx.cfg.runs, 5))


def wants_floor(cfg) -> bool:
    """The launch floor is timed when a stage compares layers with it."""
    return bool(cfg.shapes) and (cfg.main or cfg.sweep or cfg.linear)


def launch_floor(ctx) -> dict:
    """v4 on FLOOR_SHAPE, timed and checked like a shape's implementations."""
    from .. import dequantize, reference

    shape, dtype = FLOOR_SHAPE, ctx.cfg.dtype
    ctx.bar.set_description_str(f"launch floor ({shape.label})")
    inputs = make_inputs(shape.K, shape.N, shape.G, dtype, ctx.cfg.seed)
    check = ctx.backend.check(reference.dequantize(*inputs, group_size=shape.G), dtype)
    case = ctx.backend.case(shape, dtype, inputs)
    impl = Impl("v4", lambda c=case: dequantize(c.qweight, c.qzeros, c.scales,
                                                group_size=c.group_size, out=c.out, kernel="v4"),
                True, ctx.backend.poison(case), "dequantize(kernel='v4', out=) of a 1x8 layer")
    warm, raw, _ = time_impls(ctx, {"v4": impl}, check)
    rec = records({"v4": impl}, warm, raw, bytes_moved(shape.K, shape.N, shape.G, dtype),
                  None, {})["v4"]
    del case, check
    return {"K": shape.K, "N": shape.N, "G": shape.G, "call": rec["call"],
            "samples_us": rec["samples_us"], "stats": rec["stats"],
            "median_us": rec["stats"].get("median_us"), "error": rec["error"],
            "bitexact": rec["bitexact"]}


def apply_cuda_copy(result: dict) -> None:
    """Once both CUDA copy measurements exist: the run's copy bandwidth, each
    record's share of it, and each layer's floor model and distance from it."""
    bw = result.get("copy_bandwidth")
    if not bw:
        return
    samples = [x for m in bw["measurements"] for x in m["samples_us"]]
    median = statistics.median(samples)
    bw["median_us"] = median
    bw["gbps"] = bw["measurements"][0]["bytes_moved"] / (median * 1e3)
    floor = (result.get("launch_floor") or {}).get("median_us")
    for s in result["shapes"]:
        s["copy_gbps"] = bw["gbps"]
        recs = list(s.get("implementations", {}).values())
        recs += list((s.get("sweep") or {}).get("candidates", {}).values())
        for r in recs:
            if r.get("gbps"):
                r["pct_copy"] = 100.0 * r["gbps"] / bw["gbps"]
        if floor:
            s["floor_model_us"] = floor + s["bytes"] / (bw["gbps"] * 1e3)
            for r in recs:
                median = (r.get("stats") or {}).get("median_us")
                if median:
                    r["over_floor_us"] = median - s["floor_model_us"]
