"""What the benchmark writes: the environment record, the plain-text tables
and the PNG plots. Everything here reads the result dict bench.py builds;
nothing here measures."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import socket
import statistics
import subprocess
import sys

# --------------------------------------------------------------------------
# Environment
# --------------------------------------------------------------------------


def _safe(fn, default=None):
    try:
        return fn()
    except Exception:
        return default


def _version(dist: str):
    from importlib import metadata

    return _safe(lambda: metadata.version(dist))


def _git(tree: str, *args: str):
    out = subprocess.run(["git", "-C", tree, *args], capture_output=True, text=True, timeout=10)
    return out.stdout.strip() if out.returncode == 0 else None


def git_info() -> dict:
    """Commit of the package's source tree, when it is a git checkout (else nulls)."""
    from . import __file__ as package_file

    tree = os.path.dirname(os.path.dirname(os.path.abspath(package_file)))
    top = _safe(lambda: _git(tree, "rev-parse", "--show-toplevel"))
    # An installed package under some unrelated repository is not a checkout of ours.
    if not top or os.path.realpath(top) != os.path.realpath(tree):
        return {"commit": None, "dirty": None, "tree": tree}
    status = _safe(lambda: _git(tree, "status", "--porcelain", "--untracked-files=no"))
    return {
        "commit": _safe(lambda: _git(tree, "rev-parse", "HEAD")),
        "dirty": None if status is None else bool(status),
        "tree": tree,
    }


def _cpu_model():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


_SMI_FIELDS = ("index,name,driver_version,pstate,clocks.sm,clocks.mem,clocks.max.sm,"
               "clocks.max.mem,power.draw,power.limit,temperature.gpu,persistence_mode,"
               "memory.used,memory.total")


def nvidia_smi() -> list[dict] | None:
    """One dict per GPU from nvidia-smi, or None when it is missing or fails."""
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={_SMI_FIELDS}", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    keys = _SMI_FIELDS.split(",")
    rows = []
    for line in out.stdout.strip().splitlines():
        values = [v.strip() for v in line.split(",")]
        if len(values) == len(keys):
            rows.append(dict(zip(keys, values)))
    return rows


def _driver_cuda_version():
    """cuDriverGetVersion through libcuda (e.g. 13000 for CUDA 13.0), or None."""
    import ctypes

    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        version = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(version)) == 0:
            return version.value
    return None


def environment(device: str, torch=None, torch_device=None) -> dict:
    """Where and with what the benchmark ran. Never raises."""
    from . import _C, __version__, build_info, cache_path

    env = {
        "hostname": _safe(socket.gethostname),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "platform": _safe(platform.platform),
        "cpu": _safe(_cpu_model),
        "cpu_count": os.cpu_count(),
        "versions": {
            "awq_fast_dequant": __version__,
            "numpy": _version("numpy"),
            "torch": _version("torch"),
            "ml_dtypes": _version("ml_dtypes"),
            "cupy": _version("cupy") or _version("cupy-cuda13x") or _version("cupy-cuda12x"),
            "tqdm": _version("tqdm"),
            "matplotlib": _version("matplotlib"),
            "vllm": _version("vllm"),
            "sgl_kernel": _version("sgl-kernel"),
        },
        "build_info": _safe(build_info),
        "git": _safe(git_info, {"commit": None, "dirty": None}),
        "cache_path": _safe(cache_path),
        "environment_variables": {k: v for k, v in os.environ.items()
                                  if k.startswith("AWQ_FAST_DEQUANT_") or k == "CUDA_VISIBLE_DEVICES"
                                  or k == "OMP_NUM_THREADS"},
        "device": device,
    }
    if torch is not None and device.startswith("cuda"):
        props = _safe(lambda: torch.cuda.get_device_properties(torch_device))
        env["gpu"] = None if props is None else {
            "name": props.name,
            "index": torch_device.index,
            "capability": f"{props.major}.{props.minor}",
            "sm_count": props.multi_processor_count,
            "memory_bytes": props.total_memory,
            "l2_bytes": getattr(props, "L2_cache_size", None),
        }
        env["cuda_runtime"] = {
            "torch": _safe(lambda: torch.version.cuda),
            "awq_fast_dequant": (env["build_info"] or {}).get("cuda_runtime_version"),
        }
        env["driver_cuda_version"] = _safe(_driver_cuda_version)
        env["launch_path"] = _safe(_C._launch_path)  # "driver" (cuLaunchKernel) or "runtime"
        smi = _safe(nvidia_smi)
        env["nvidia_smi"] = smi
        env["driver"] = smi[0]["driver_version"] if smi else None
        env["torch_allow_tf32_matmul"] = _safe(lambda: torch.backends.cuda.matmul.allow_tf32)
    return env


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


HOST_FLOOR_CASE = "empty kernel launch (floor)"


def above_floor(host: dict, name: str):
    """Median over repeats of (case - floor) in microseconds per call: each
    repeat times every case within a few milliseconds, so the difference
    cancels what the machine does to all of them at once.  None when the
    floor is missing or the repeats do not pair up."""
    cases = host.get("cases", {})
    floor = cases.get(HOST_FLOOR_CASE, {}).get("samples_us_per_call") or []
    mine = cases.get(name, {}).get("samples_us_per_call") or []
    if name == HOST_FLOOR_CASE or not floor or len(floor) != len(mine):
        return None
    return statistics.median(a - b for a, b in zip(mine, floor))


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
# Plots
# --------------------------------------------------------------------------


def plot_paths(spec: str) -> dict[str, str]:
    """--plot PATH: a folder (existing, or ending in '/') gets bench_*.png,
    anything else is a prefix: PATH_gbps.png, PATH_host.png, PATH_prefill.png."""
    if spec.endswith(("/", os.sep)) or os.path.isdir(spec):
        base = os.path.join(spec, "bench")
    else:
        base = spec
    return {k: f"{base}_{k}.png" for k in ("gbps", "host", "prefill")}


def _title_context(result: dict) -> str:
    cfg = result["config"]
    env = result.get("environment", {})
    where = (env.get("gpu") or {}).get("name") if cfg["device"].startswith("cuda") else (
        env.get("cpu") or "CPU")
    return f"{where}, {cfg['dtype']}, G={cfg['group']}"


def write_plots(result: dict, spec: str) -> tuple[list[str], str | None]:
    """Write the PNGs; returns (paths written, reason when none could be)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:
        return [], f"plots skipped (matplotlib unavailable: {exc})"

    paths = plot_paths(spec)
    os.makedirs(os.path.dirname(os.path.abspath(paths["gbps"])), exist_ok=True)
    written = []
    shapes = [s for s in result["shapes"] if s.get("implementations")]
    if shapes:
        _plot_gbps(plt, result, shapes, paths["gbps"])
        written.append(paths["gbps"])
    host = result.get("host_overhead")
    if host and any(e.get("median_us") for e in host.get("cases", {}).values()):
        _plot_host(plt, result, host, paths["host"])
        written.append(paths["host"])
    if any(s.get("prefill") for s in result["shapes"]):
        _plot_prefill(plt, result, paths["prefill"])
        written.append(paths["prefill"])
    return written, None


def _shape_ticks(shapes):
    return [f"{s['model']}\n{s['K']}×{s['N']}" for s in shapes]


def _plot_gbps(plt, result, shapes, path):
    import numpy as np

    names = []
    for s in shapes:
        for n in s["implementations"]:
            if n not in names:
                names.append(n)
    x = np.arange(len(shapes))
    width = 0.84 / max(len(names), 1)
    fig, ax = plt.subplots(figsize=(max(8.0, 1.25 * len(shapes) + 4.0), 5.6))
    cmap = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    for i, name in enumerate(names):
        vals, inexact = [], False
        for s in shapes:
            rec = s["implementations"].get(name, {})
            vals.append(rec.get("gbps") or 0.0)
            inexact |= rec.get("bitexact") is False
        label = name + (" (not bit-exact)" if inexact else "")
        ax.bar(x + (i - (len(names) - 1) / 2) * width, vals, width, label=label, color=cmap(i),
               hatch="//" if inexact else None, edgecolor="white", linewidth=0.4)
    top = max([b.get_height() for b in ax.patches] + [0.0])
    copy = result.get("copy_bandwidth") or {}
    if copy.get("gbps"):
        top = max(top, copy["gbps"])
        ax.axhline(copy["gbps"], color="black", linestyle="--", linewidth=1.2,
                   label=f"device-to-device copy ({copy['gbps']:.0f} GB/s)")
    else:  # CPU: one output-sized copy per shape
        for i, s in enumerate(shapes):
            c = (s.get("copy_bandwidth") or {}).get("gbps")
            if c:
                top = max(top, c)
                ax.hlines(c, i - 0.45, i + 0.45, colors="black", linestyles="--", linewidth=1.2,
                          label="memory copy, output-sized (np.copyto)" if i == 0 else None)
    labelled = False
    for xi, s in zip(x, shapes):  # the layer's floor model as a bandwidth
        if not s.get("floor_model_us"):
            continue
        ceiling = s["bytes"] / (s["floor_model_us"] * 1e3)
        top = max(top, ceiling)
        ax.hlines(ceiling, xi - 0.45, xi + 0.45, colors="dimgray", linestyles=":", linewidth=1.6,
                  label=None if labelled else "floor model (launch floor + bytes at copy bandwidth)")
        labelled = True
    if top > 0:
        ax.set_ylim(0, top * 1.08)
    ax.set_xticks(x, _shape_ticks(shapes), fontsize=8)
    ax.set_xlabel("layer shape: K (in_features) × N (out_features)")
    ax.set_ylabel("achieved bandwidth (GB/s)\nmodel bytes / median time")
    cold = "cold L2" if result["config"]["device"] != "cpu" else "caches flushed by a memset"
    ax.set_title(f"AWQ dequantize throughput, {cold}: {_title_context(result)} (higher is better)",
                 fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def _plot_host(plt, result, host, path):
    cases = [(n, e) for n, e in host["cases"].items() if e.get("median_us")]
    fig, ax = plt.subplots(figsize=(8.5, 0.6 * len(cases) + 1.8))
    y = list(range(len(cases)))
    vals = [e["median_us"] for _, e in cases]
    bars = ax.barh(y, vals, color=["tab:olive" if n == HOST_FLOOR_CASE else
                                   "tab:gray" if "torch" in n else "tab:blue" for n, _ in cases])
    for b, v in zip(bars, vals):
        ax.text(b.get_width(), b.get_y() + b.get_height() / 2, f" {v:.2f} µs", va="center", fontsize=8)
    for n, e in cases:
        if n == HOST_FLOOR_CASE:
            ax.axvline(e["median_us"], color="tab:olive", linestyle="--", linewidth=1,
                       label="the machine's floor: an empty kernel launch")
            ax.legend(loc="lower right", fontsize=8)
    ax.set_yticks(y, [n for n, _ in cases], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")  # the torch baseline is 20-30x the others
    lo, hi = min(vals) / 2, max(vals) * 2.5
    ax.set_xlim(lo, hi)
    ticks = [t for t in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000) if lo <= t <= hi]
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("host time per call (µs, log scale), GPU kept busy: lower is better")
    ax.set_title(f"Host overhead per call, shape {host['label']}: {_title_context(result)}", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def _plot_prefill(plt, result, path):
    import numpy as np

    shapes = [s for s in result["shapes"] if s.get("prefill")]
    ms = sorted({p["M"] for s in shapes for p in s["prefill"]})
    x = np.arange(len(shapes))
    width = 0.8 / max(len(ms), 1)
    fig, ax = plt.subplots(figsize=(max(8.0, 1.1 * len(shapes) + 3.5), 5.0))
    for i, m in enumerate(ms):
        vals = []
        for s in shapes:
            f = next((p.get("fraction") for p in s["prefill"] if p["M"] == m), None)
            vals.append(100 * f if f is not None else 0.0)
        bars = ax.bar(x + (i - (len(ms) - 1) / 2) * width, vals, width, label=f"M = {m} tokens")
        for b, v in zip(bars, vals):
            ax.text(b.get_x() + b.get_width() / 2, max(v, 0.0), f"{v:.0f}%", ha="center",
                    va="bottom", fontsize=7)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(x, _shape_ticks(shapes), fontsize=8)
    ax.set_xlabel("layer shape: K × N")
    ax.set_ylabel("dequantize share of layer time (%)\n(t[deq+mm] − t[mm]) / t[deq+mm]")
    ax.set_title(f"Prefill: smart_dequantize + torch.matmul vs dense matmul: {_title_context(result)}",
                 fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
