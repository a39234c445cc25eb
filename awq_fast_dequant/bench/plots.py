"""The PNG plots of a run (--plot): GB/s per shape and implementation, host
microseconds per call, the prefill share, and with --linear one plot per
layer and dtype of time against M. Reads the result dict only."""

from __future__ import annotations

import os

from .host import HOST_FLOOR_CASE

def _base(spec: str) -> str:
    if spec.endswith(("/", os.sep)) or os.path.isdir(spec):
        return os.path.join(spec, "bench")
    return spec


def plot_paths(spec: str) -> dict[str, str]:
    """--plot PATH: a folder (existing, or ending in '/') gets bench_*.png,
    anything else is a prefix: PATH_gbps.png, PATH_host.png, PATH_prefill.png."""
    base = _base(spec)
    return {k: f"{base}_{k}.png" for k in ("gbps", "host", "prefill")}


def linear_plot_path(spec: str, layer: dict) -> str:
    """PATH_linear_<model>_<K>x<N>_<dtype>.png: one per layer and dtype."""
    return f"{_base(spec)}_linear_{layer.get('model')}_{layer['label']}_{layer['dtype']}.png"


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
    for layer in (result.get("linear") or {}).get("layers", []):
        if layer.get("points"):
            path = linear_plot_path(spec, layer)
            _plot_linear(plt, result, layer, path)
            written.append(path)
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


# The rows of a --linear plot and how each is drawn.
_LINEAR_STYLE = {"fused": ("tab:blue", "o", "-"), "auto": ("tab:green", "s", "-"),
                 "dequant+matmul": ("tab:orange", "^", "-"), "dense": ("tab:gray", "D", "--")}


def _plot_linear(plt, result, layer, path):
    points = layer["points"]
    ms = [p["M"] for p in points]
    fig, ax = plt.subplots(figsize=(8.0, 5.2))
    names = []
    for p in points:
        names += [n for n in p["impls"] if n not in names]
    for i, name in enumerate(names):
        color, marker, line = _LINEAR_STYLE.get(name, (plt.get_cmap("tab10")(4 + i), "x", ":"))
        xs, ys, bad = [], [], []
        for p in points:
            rec = p["impls"].get(name) or {}
            us = (rec.get("stats") or {}).get("median_us")
            if us:
                xs.append(p["M"])
                ys.append(us)
                if rec.get("within_tolerance") is False:
                    bad.append((p["M"], us))
        label = name
        if name == "fused" and any((p["impls"].get(name) or {}).get("materializes_w") is True
                                   for p in points):
            label += " (W materialized: the dequantize path)"
        if xs:
            ax.plot(xs, ys, color=color, marker=marker, linestyle=line, linewidth=1.4,
                    markersize=4, label=label)
        if bad:
            ax.scatter(*zip(*bad), s=90, facecolors="none", edgecolors="red", linewidths=1.5,
                       label=f"{name}: outside the tolerance", zorder=5)
    floor = [(p["M"], p["floor_model_us"]) for p in points if p.get("floor_model_us")]
    if floor:
        ax.plot(*zip(*floor), color="black", linestyle=":", linewidth=1.4,
                label="floor model (launch + max(bytes at copy BW, FLOPs at peak))")
    cross = layer.get("crossover_M")
    if cross:
        ax.axvline(cross, color="tab:red", linestyle="--", linewidth=1.0,
                   label=f"crossover: auto picks dequant+matmul from M = {cross}")
    else:
        ax.plot([], [], " ", label="no crossover: auto fuses at every M timed")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ms, [str(m) for m in ms], fontsize=8)
    ax.minorticks_off()
    ax.set_xlabel("M (rows of x)")
    ax.set_ylabel("median time per call (us, log scale)")
    ax.set_title(f"linear {layer.get('model')} {layer['K']}×{layer['N']}, {layer['dtype']}, "
                 f"G={layer['G']}: {_title_context(result).split(',')[0]} (lower is better)",
                 fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.set_axisbelow(True)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
