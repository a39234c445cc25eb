"""The text of a --linear run: the rows per layer, dtype and M, the
dispatcher's choice per M with the crossover, and the targets' verdict.
Reads the result dict only."""

from __future__ import annotations

from .report import table


def _f(x, fmt="{:.2f}"):
    return "-" if x is None else fmt.format(x)


def choice_text(entry: dict | None) -> str:
    """An autotune entry in a few words: its kernel and the fields it sets."""
    if not entry:
        return "untuned"
    fields = [f"{k}={entry[k]}" for k in ("block_size", "rows", "split", "threads", "chunk")
              if entry.get(k)]
    return " ".join([str(entry.get("kernel"))] + fields)


def _tolerance_text(rec: dict) -> str:
    if rec.get("error"):
        return "ERROR"
    if rec.get("within_tolerance") is None:
        return "-"
    if rec["within_tolerance"]:
        return "yes"
    return "OUTSIDE" if rec.get("ours") else "outside"


def _kernel_text(name: str, rec: dict, point: dict) -> str:
    if name == "auto":
        return choice_text(point.get("auto_choice"))
    if rec.get("materializes_w") is True:
        return "W materialized: dequantize path"
    if rec.get("materializes_w") is False:
        return "no W materialized"
    return ""


def rows_table(result: dict) -> str:
    lin = result.get("linear") or {}
    cuda = result["config"]["device"] != "cpu"
    rows = []
    for layer in lin.get("layers", []):
        head = f"{layer.get('model')} {layer['label']}"
        for p in layer.get("points", []):
            first = True
            for name, rec in p["impls"].items():
                stats = rec.get("stats") or {}
                mean = _f(stats.get("mean_us"), "{:.2f}" if cuda else "{:.0f}")
                if stats.get("unstable"):
                    mean += " *"
                lead = [head, layer["dtype"], p["M"]] if first else ["", "", ""]
                if cuda:
                    figures = [_f(p.get("floor_model_us")) if first else "", name,
                               _f(stats.get("median_us")), mean, _f(rec.get("x_floor")),
                               _f(rec.get("x_dense")), _f(rec.get("gbps"), "{:.0f}"),
                               _f(rec.get("tflops"), "{:.1f}")]
                else:
                    figures = [name, _f(stats.get("median_us"), "{:.0f}"), mean,
                               _f(rec.get("x_dense")), _f(rec.get("packed_gbps")),
                               _f(rec.get("x_copy")),
                               _f(None if rec.get("tflops") is None else 1e3 * rec["tflops"],
                                  "{:.1f}")]
                rows.append(lead + figures + [_tolerance_text(rec), _kernel_text(name, rec, p)])
                head, first = "", False
    if not rows:
        return ""
    if cuda:
        headers = ["layer (K x N)", "dtype", "M", "floor us", "row", "median us", "mean us",
                   "x floor", "x dense", "GB/s", "TFLOP/s"]
        notes = ("floor us = the floor model: launch floor + max(bytes / copy bandwidth, "
                 "2MKN / peak FLOP/s), measured in this run but the peak;"
                 "\nx floor = median / floor model; x dense = dense median / median (a speedup); "
                 "GB/s = the floor model's bytes / median")
    else:
        headers = ["layer (K x N)", "dtype", "M", "row", "median us", "mean us", "x dense",
                   "packed GB/s", "x copy", "GFLOP/s"]
        notes = ("x dense = numpy.matmul(x_f32, W_f32) median / median (a speedup); packed GB/s = "
                 "packed weights + zeros + scales / median;\nx copy = packed GB/s over the "
                 "np.copyto rate (bytes copied per second) of this run")
    headers += ["tolerance", "kernel"]
    right = set(range(2, len(headers) - 2)) - {headers.index("row")}
    return (table(headers, rows, right=right)
            + "\n* mean and median differ by more than 15% (unstable timing; point flagged)\n"
            + notes + "\ntolerance: |y - y64| <= 2^-9 (|x| @ |W|) + 1 ulp on the checked rows, "
                      "every trial")


def choices_table(result: dict) -> str:
    lin = result.get("linear") or {}
    ms = lin.get("M", [])
    rows = []
    for layer in lin.get("layers", []):
        by_m = {p["M"]: p for p in layer.get("points", [])}
        picks = [str((by_m[m].get("auto_choice") or {}).get("kernel", "-")) if m in by_m else ""
                 for m in ms]
        rows.append([f"{layer.get('model')} {layer['label']}", layer["dtype"]] + picks
                    + [_f(layer.get("crossover_M"), "{}") if layer.get("points") else ""])
    if not rows:
        return ""
    return table(["layer (K x N)", "dtype"] + [f"M={m}" for m in ms] + ["crossover M"], rows,
                 right=set(range(2, len(ms) + 3))) + (
        "\nthe kernel of each M bucket in the autotune cache (what auto runs); crossover M = "
        "the smallest M where auto picks dequant (- = none)")


def verdict_text(result: dict) -> str:
    verdict = result.get("verdict")
    if not verdict:
        return ""
    rows = []
    for t in verdict["targets"]:
        worst = t.get("worst")
        worst_text = "-"
        if worst:
            worst_text = (f"{worst['value']:.3g} ({worst['model']} {worst['layer']} "
                          f"{worst['dtype']} M={worst['M']})")
        status = "not run" if not t["evaluations"] else (
            "met" if t["met"] == len(t["evaluations"]) else "MISSED")
        rows.append([t["text"], f"{t['metric']} {t['op']} {t['limit']:g}", status,
                     f"{t['met']}/{len(t['evaluations'])}", worst_text])
    text = table(["target", "figure", "status", "met", "worst"], rows, right={3})
    text += (f"\n{verdict['met']} met, {verdict['missed']} missed, {verdict['unmeasured']} not "
             f"measured; missed targets "
             + ("fail the run (--strict)" if verdict["strict"] else "are reported, not failed "
                "(--strict fails them)"))
    if verdict["missed_text"]:
        text += "\nmissed:\n  " + "\n  ".join(verdict["missed_text"])
    return text


def linear_header(result: dict) -> str:
    lin = result.get("linear") or {}
    lines = []
    copy = lin.get("copy")
    if copy and copy.get("copied_gbps"):
        lines.append(f"np.copyto rate: {copy['copied_gbps']:.2f} GB/s copied "
                     f"({copy['buffer_bytes'] >> 20} MiB, median of {len(copy['samples_us'])})")
    if lin.get("peak_flops"):
        lines.append("floor model peak FLOP/s: " + ", ".join(
            f"{d} {v / 1e12:.0f}T" for d, v in lin["peak_flops"].items()))
    for layer in lin.get("layers", []):
        if layer.get("error"):
            lines.append(f"{layer['label']} {layer['dtype']}: {layer['error']}")
    return "\n".join(lines)
