"""What the benchmark prints and writes: the plain-text tables, the report
on stdout, and the JSON file. Everything here reads the result dict the
stages fill; nothing here measures."""

from __future__ import annotations

import json
import os
import re
import sys

import numpy as np

from .host import above_floor


# --------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------


def table(headers: list[str], rows: list[list], right: set[int] | None = None) -> str:
    """A plain-text table; columns in `right` are right-aligned (numbers)."""
    right = right if right is not None else set(range(1, len(headers)))
    cells = [[("" if c is None else str(c)) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(values):
        parts = [v.rjust(w) if i in right else v.ljust(w) for i, (v, w) in enumerate(zip(values, widths))]
        return "  ".join(parts).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), sep] + [line(r) for r in cells])


def _f(x, fmt="{:.1f}"):
    return "-" if x is None else fmt.format(x)


def _bitexact_text(rec: dict) -> str:
    if rec.get("error"):
        return "ERROR"
    if rec.get("bitexact"):
        return "yes"
    if rec.get("bitexact") is None:
        return "-"
    return "NOT bit-exact" if rec.get("ours") else "not bit-exact"


def main_table(result: dict) -> str:
    floors = any(s.get("floor_model_us") for s in result["shapes"])
    rows = []
    for shape in result["shapes"]:
        first = True
        for name, rec in shape.get("implementations", {}).items():
            stats = rec.get("stats") or {}
            mean = _f(stats.get("mean_us"), "{:.2f}")
            if stats.get("unstable"):
                mean += " *"
            rows.append([
                f"{shape['model']} {shape['label']}" if first else "",
                name,
                _f(stats.get("median_us"), "{:.2f}"),
                mean,
                _f(rec.get("gbps")),
                _f(rec.get("pct_copy"), "{:.1f}%"),
            ] + ([_f(rec.get("over_floor_us"), "{:+.2f}")] if floors else []) + [
                _bitexact_text(rec),
            ])
            first = False
    if not rows:
        return ""
    headers = ["shape (K x N)", "impl", "median us", "mean us", "GB/s", "% copy"]
    headers += ["vs floor model us"] if floors else []
    text = table(headers + ["bit-exact"], rows, right=set(range(2, len(headers))))
    text += "\n* mean and median differ by more than 15% (unstable timing; shape flagged)"
    if floors:
        text += ("\nvs floor model = median - (launch floor + bytes / copy bandwidth), both "
                 "measured in this run")
    return text


def problems_text(result: dict) -> str:
    lines = []
    for shape in result["shapes"]:
        for section, recs in (("", shape.get("implementations", {})),
                              ("sweep ", (shape.get("sweep") or {}).get("candidates", {}))):
            for name, rec in recs.items():
                if rec.get("error"):
                    lines.append(f"{shape['label']}: {section}{name}: {rec['error']}")
                elif rec.get("bitexact") is False:
                    bad = sum(1 for m in rec.get("mismatches", []) if m)
                    most = max(rec.get("mismatches", []) + [rec.get("warmup", {}).get("mismatches", 0)])
                    notes = "; ".join(sorted(set(rec.get("notes", []))))
                    lines.append(f"{shape['label']}: {section}{name}: not bit-exact in {bad} of "
                                 f"{len(rec.get('mismatches', []))} trials (up to {most} of "
                                 f"{shape['K'] * shape['N']} elements differ){'; ' + notes if notes else ''}")
    return "\n".join(lines)


def sweep_table(result: dict) -> str:
    shapes = [s for s in result["shapes"] if s.get("sweep")]
    if not shapes:
        return ""
    names = []
    for s in shapes:
        for n in s["sweep"]["candidates"]:
            if n not in names:
                names.append(n)
    rows = []
    for s in shapes:
        cands = s["sweep"]["candidates"]
        rows.append([s["label"]] + [
            _f((cands.get(n, {}).get("stats") or {}).get("median_us"), "{:.1f}")
            + ("*" if (cands.get(n, {}).get("stats") or {}).get("unstable") else "")
            for n in names])
    grid = table(["median us"] + names, rows)
    rows = []
    for s in shapes:
        sw = s["sweep"]
        pick = sw.get("smart_pick") or {}
        pick_text = "-"
        if pick:
            pick_text = f"{pick.get('kernel')} bs={pick.get('block_size')}"
            if pick.get("rows"):
                pick_text += f" rows={pick.get('rows')}"
        rows.append([
            s["label"],
            sw.get("winner") or "-",
            _f(sw.get("winner_us"), "{:.1f}"),
            sw.get("runner_up") or "-",
            _f(sw.get("margin_runner_up_pct"), "{:+.1f}%"),
            _f(sw.get("margin_v4_default_pct"), "{:+.1f}%"),
            pick_text,
            _f(sw.get("smart_us"), "{:.1f}"),
            _f(sw.get("smart_vs_winner_pct"), "{:+.1f}%"),
        ])
    summary = table(["shape", "winner", "us", "runner-up", "margin", "vs v4 default",
                     "smart picked", "smart us", "smart vs winner"], rows,
                    right={2, 4, 5, 7, 8})
    return grid + "\n\n" + summary + (
        "\nmargin = how much slower the runner-up is; vs v4 default = how much slower v4 with its"
        "\ndefault block size is; smart vs winner = smart_dequantize's measured time over the winner's.")


_LAUNCH_PATHS = {"driver": "the driver (cuLaunchKernel)",
                 "runtime": "the runtime (cudaLaunchKernel; AWQ_FAST_DEQUANT_RUNTIME_LAUNCH=1 "
                            "or no driver entry point)"}


def host_table(result: dict) -> str:
    host = result.get("host_overhead")
    if not host or not host.get("cases"):
        return ""
    path = (result.get("environment") or {}).get("launch_path") or "unknown"
    rows = []
    for name, e in host["cases"].items():
        busy = "yes" if e.get("all_busy") else ("ERROR" if e.get("error") else "NO")
        rows.append([name, _f(e.get("median_us"), "{:.2f}"), _f(e.get("min_us"), "{:.2f}"),
                     _f(above_floor(host, name), "{:+.2f}"),
                     f"{e['calls']} x {len(e.get('samples_us_per_call', []))}", busy])
    return table(["call (shape " + host["label"] + ")", "median us/call", "min us/call",
                  "above floor", "calls x repeats", "GPU busy throughout"], rows,
                 right={1, 2, 3, 4}) + (
        "\nabove floor = median over repeats of (call - empty kernel launch) in the same repeat:"
        "\nthe host work of the call itself, whatever the machine's speed at the moment."
        f"\nkernels launched through: {_LAUNCH_PATHS.get(path, path)}")


def prefill_table(result: dict) -> str:
    rows = []
    for s in result["shapes"]:
        for p in s.get("prefill") or []:
            st = p.get("stats", {})
            rows.append([
                s["label"], p["M"],
                _f((st.get("dequant") or {}).get("median_us"), "{:.1f}"),
                _f((st.get("dequant+matmul") or {}).get("median_us"), "{:.1f}"),
                _f((st.get("matmul") or {}).get("median_us"), "{:.1f}"),
                _f(None if p.get("fraction") is None else 100 * p["fraction"], "{:.1f}%"),
            ])
    if not rows:
        return ""
    return table(["shape (K x N)", "M tokens", "dequant us", "dequant+matmul us",
                  "dense matmul us", "dequant share"], rows) + (
        "\ndequant share = (t[dequant+matmul] - t[dense matmul]) / t[dequant+matmul]")


# --------------------------------------------------------------------------
# The report and the JSON
# --------------------------------------------------------------------------


def _json_default(obj):
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return str(obj)


# An array whose elements hold no brackets or braces (numbers, names): json.dumps
# never writes a raw newline inside a string, so "[" + newline is structural.
_FLAT_ARRAY = re.compile(r"\[\n\s*((?:[^\[\]{}\n]+\n\s*)*?[^\[\]{}\n]+)\n\s*\]")


def to_json(result: dict) -> str:
    """Indented JSON with every flat array (timings, orders) on one line."""
    text = json.dumps(result, indent=1, default=_json_default)
    return _FLAT_ARRAY.sub(lambda m: "[" + re.sub(r"\n\s*", " ", m.group(1)) + "]", text)


def write_json(result: dict, path: str) -> None:
    """to_json into `path`, through a temporary file: a reader never sees half a file."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(to_json(result) + "\n")
    os.replace(tmp, path)


def print_report(result: dict, file=sys.stdout) -> None:
    """The run on stdout: its setting, the tables, the problems and the verdict."""
    cfg = result["config"]
    env = result.get("environment") or {}
    where = (env.get("gpu") or {}).get("name") if cfg["device"] != "cpu" else env.get("cpu")
    what = "linear " + ",".join(cfg.get("dtypes") or [cfg["dtype"]]) if cfg.get("linear") else cfg["dtype"]
    head = (f"awq_fast_dequant bench: {where} ({cfg['device']}), {what}, "
            f"{cfg['trials']} trials x {cfg['runs']} runs, cache flush {cfg.get('flush_bytes', 0) >> 20} MiB")
    print("\n" + head, file=file)
    bw = result.get("copy_bandwidth")
    if bw and bw.get("gbps"):
        print(f"device-to-device copy: {bw['gbps']:.0f} GB/s (median of "
              f"{sum(len(m['samples_us']) for m in bw['measurements'])}, "
              f"{bw['measurements'][0]['buffer_bytes'] >> 20} MiB read + written, start and end "
              f"of the run)", file=file)
    floor = result.get("launch_floor") or {}
    if floor.get("median_us"):
        model = ("max(its bytes at the copy bandwidth, 2MKN at the peak FLOP/s)" if cfg.get("linear")
                 else "its bytes at the copy bandwidth")
        print(f"launch floor: {floor['median_us']:.2f} us (v4 on a 1x8 layer, timed like the "
              f"shapes); a layer's floor model = that + {model}", file=file)
    for name, st in (result.get("peers") or {}).items():
        print(f"{name}: {st['status']}", file=file)
    from .linear_report import choices_table, linear_header, rows_table, verdict_text

    for title, text in (("", main_table(result)),
                        ("", linear_header(result)),
                        ("linear", rows_table(result)),
                        ("Dispatcher choice per M (auto)", choices_table(result)),
                        ("Block-size sweep", sweep_table(result)),
                        ("Prefill", prefill_table(result)),
                        ("Host overhead", host_table(result)),
                        ("Verdict: the targets", verdict_text(result))):
        if text:
            print(("\n" + title + "\n" if title else "\n") + text, file=file)
    problems = problems_text(result)
    if result.get("linear"):
        linear_problems = [f for f in (result.get("summary") or {}).get("failures", [])
                           if f.startswith("linear ")]
        problems = "\n".join(([problems] if problems else []) + linear_problems)
    if problems:
        print("\nProblems:\n" + problems, file=file)
    summary = result.get("summary") or {}
    if summary:
        good = ("all of ours within the tolerance on every trial" if cfg.get("linear")
                else "all of ours bit-exact on every trial")
        verdict = (good if summary.get("exit_code") == 0
                   else f"FAILED: {len(summary.get('failures', []))} problem(s)")
        print(f"\nresult: {verdict}", file=file)
