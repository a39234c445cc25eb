"""The targets of the linear benchmark and their verdict.

Each target is one rule the fused linear is held to: a row
(fused or auto), the M and layers it applies to, a figure of that row and a
limit. The verdict evaluates every rule on every (layer, dtype, M) of the run
it applies to; a missed target is reported, and fails the run only with
--strict. Pure functions of the result dict: nothing here measures.

The CUDA targets are stated for float16 on the preset layers (bf16 has its
own rule: within 5% of float16); where a rule names no layers it applies to
every preset, except that the speedups over the dense matmul are held on the
Llama-3 layers only, as they are stated for M <= 4: on the Qwen2.5-1.5B
layers the launch floor alone is most of a dense matmul's time. The CPU
targets apply at M = 1 in float16 on every layer run.
"""

from __future__ import annotations

from dataclasses import dataclass

LLAMA = ("llama-3-8b", "llama-3-70b")
QWEN = ("qwen2.5-1.5b",)
PRESET_MODELS = QWEN + LLAMA

# What each metric of a row is, for the report.
METRICS = {
    "x_floor": "time / floor model",
    "x_dense": "dense time / time (speedup)",
    "slowdown": "time / dense time",
    "bf16_ratio": "bfloat16 time / float16 time",
    "x_copy": "packed bytes per second / np.copyto bytes per second",
}


@dataclass(frozen=True)
class Target:
    id: str
    text: str
    device: str  # "cuda" or "cpu"
    ms: tuple[int, ...]
    models: tuple[str, ...] | None  # None: every layer
    row: str
    metric: str
    op: str  # "<=" or ">="
    limit: float
    dtype: str = "float16"


TARGETS = (
    Target("m1-floor-llama", "M=1: fused <= 1.15 x floor model on the 8B/70B layers", "cuda",
           (1,), LLAMA, "fused", "x_floor", "<=", 1.15),
    Target("m1-floor-qwen", "M=1: fused <= 1.3 x floor model on the Qwen layers", "cuda",
           (1,), QWEN, "fused", "x_floor", "<=", 1.3),
    Target("m2-4-floor", "M=2,4: fused <= 1.3 x floor model on the 8B/70B layers", "cuda",
           (2, 4), LLAMA, "fused", "x_floor", "<=", 1.3),
    Target("m1-4-dense", "M<=4: fused >= 3x faster than dense on the 8B/70B layers", "cuda",
           (1, 2, 4), LLAMA, "fused", "x_dense", ">=", 3.0),
    Target("m8-16-floor", "M=8,16: fused <= 1.3 x floor model", "cuda",
           (8, 16), PRESET_MODELS, "fused", "x_floor", "<=", 1.3),
    Target("m8-16-dense", "M=8,16: fused >= 3x faster than dense (8B/70B)", "cuda",
           (8, 16), LLAMA, "fused", "x_dense", ">=", 3.0),
    Target("m32-64-floor", "M=32,64: fused <= 1.6 x floor model", "cuda",
           (32, 64), PRESET_MODELS, "fused", "x_floor", "<=", 1.6),
    Target("m32-64-dense", "M=32,64: fused >= 2.5x faster than dense (8B/70B)", "cuda",
           (32, 64), LLAMA, "fused", "x_dense", ">=", 2.5),
    Target("m128-dense", "M=128: fused >= 1.5x faster than dense (8B/70B)", "cuda",
           (128,), LLAMA, "fused", "x_dense", ">=", 1.5),
    Target("m256-1024-auto", "M=256..1024: auto no slower than dense", "cuda",
           (256, 512, 1024), PRESET_MODELS, "auto", "slowdown", "<=", 1.0),
    Target("m4096-auto", "M=4096: auto within 5% of dense", "cuda",
           (4096,), PRESET_MODELS, "auto", "slowdown", "<=", 1.05),
    Target("bf16-f16", "bf16 fused within 5% of f16 fused (when both dtypes run)", "cuda",
           (), PRESET_MODELS, "fused", "bf16_ratio", "<=", 1.05, dtype="bfloat16"),
    Target("cpu-m1-copy", "CPU, M=1: fused packed-bytes rate >= 0.5 x the np.copyto rate", "cpu",
           (1,), None, "fused", "x_copy", ">=", 0.5),
    Target("cpu-m1-numpy", "CPU, M=1: fused >= 4x faster than numpy.matmul(x_f32, W_f32)", "cpu",
           (1,), None, "fused", "x_dense", ">=", 4.0),
)


def _median(rec: dict | None):
    return ((rec or {}).get("stats") or {}).get("median_us")


def _value(target: Target, layer: dict, point: dict, f16_points: dict):
    rec = point["impls"].get(target.row) or {}
    if target.metric == "slowdown":
        x = rec.get("x_dense")
        return 1.0 / x if x else None
    if target.metric == "bf16_ratio":
        mine, theirs = _median(rec), _median((f16_points.get(point["M"]) or {})
                                             .get("impls", {}).get(target.row))
        return mine / theirs if mine and theirs else None
    return rec.get(target.metric)


def _met(value, op: str, limit: float):
    if value is None:
        return None
    return value <= limit if op == "<=" else value >= limit


def _applies(target: Target, kind: str, layer: dict, M: int) -> bool:
    if target.device != kind or layer.get("dtype") != target.dtype:
        return False
    if target.models is not None and layer.get("model") not in target.models:
        return False
    return not target.ms or M in target.ms


def evaluate(result: dict) -> dict:
    """The verdict of a --linear result: every target, every evaluation, and
    the missed ones in words. Missing figures are `unmeasured`, never met."""
    kind = "cpu" if result["config"]["device"] == "cpu" else "cuda"
    layers = (result.get("linear") or {}).get("layers", [])
    f16 = {(lay["K"], lay["N"], lay["G"]): {p["M"]: p for p in lay.get("points", [])}
           for lay in layers if lay.get("dtype") == "float16"}
    rules, missed_text = [], []
    for t in TARGETS:
        if t.device != kind:
            continue
        evals = []
        for lay in layers:
            for p in lay.get("points", []):
                if not _applies(t, kind, lay, p["M"]):
                    continue
                if t.metric == "bf16_ratio" and (lay["K"], lay["N"], lay["G"]) not in f16:
                    continue
                value = _value(t, lay, p, f16.get((lay["K"], lay["N"], lay["G"]), {}))
                met = _met(value, t.op, t.limit)
                e = {"model": lay.get("model"), "layer": lay["label"], "dtype": lay["dtype"],
                     "M": p["M"], "row": t.row, "value": value, "met": met}
                evals.append(e)
                if met is not True:
                    shown = "not measured" if value is None else f"{value:.3g}"
                    missed_text.append(f"{t.id}: {lay.get('model')} {lay['label']} {lay['dtype']} "
                                       f"M={p['M']}: {t.row} {t.metric} {shown} (target {t.op} "
                                       f"{t.limit:g})")
        measured = [e for e in evals if e["value"] is not None]
        worst = None
        if measured:
            pick = max if t.op == "<=" else min
            worst = pick(measured, key=lambda e: e["value"])
        rules.append({
            "id": t.id, "text": t.text, "row": t.row, "metric": t.metric,
            "metric_meaning": METRICS[t.metric], "op": t.op, "limit": t.limit,
            "evaluations": evals,
            "met": sum(e["met"] is True for e in evals),
            "missed": sum(e["met"] is False for e in evals),
            "unmeasured": sum(e["met"] is None for e in evals),
            "worst": worst,
        })
    return {
        "strict": bool(result["config"].get("strict")),
        "targets": rules,
        "met": sum(r["met"] for r in rules),
        "missed": sum(r["missed"] for r in rules),
        "unmeasured": sum(r["unmeasured"] for r in rules),
        "missed_text": missed_text,
    }
