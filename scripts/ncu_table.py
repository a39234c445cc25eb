"""The table of scripts/ncu_profile.sh: turns an `ncu --csv --page raw`
export into one side-by-side table of the profiled kernels (and a JSON file).

    python3 scripts/ncu_table.py REPORT.csv [--kernels v1,v2,v3,v4] [--json OUT.json]

--kernels names the kernels in launch order; it labels kernels whose names do
not say which they are. Exit status 1 when the export holds no kernel row."""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
import sys

from awq_fast_dequant.bench import text_table

# The metrics scripts/ncu_profile.sh collects, in table order: (metric, column title).
METRICS = (
    ("gpu__time_duration.sum", "duration"),
    ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM %"),
    ("l1tex__throughput.avg.pct_of_peak_sustained_active", "L1/TEX %"),
    ("sm__warps_active.avg.pct_of_peak_sustained_active", "achieved occ %"),
    ("sm__maximum_warps_per_active_cycle_pct", "theoretical occ %"),
    ("launch__registers_per_thread", "regs/thread"),
    ("launch__block_size", "block"),
    ("launch__grid_size", "grid"),
    ("dram__bytes_read.sum", "DRAM read"),
    ("dram__bytes_write.sum", "DRAM write"),
)

_KERNEL_ID = re.compile(r"awq_v([1-4])")


def _number(text: str):
    text = (text or "").strip().replace(",", "")
    if not text or text.lower() in ("n/a", "nan"):
        return None
    try:
        return float(text)
    except ValueError:
        return None


def parse_raw_csv(text: str) -> tuple[list[dict], dict]:
    """Rows of `ncu --csv --page raw` as dicts, and the units row.

    ncu may print "==PROF==" / "==WARNING==" lines first: the header is the
    first line that starts with "ID". The line after it holds the units when
    its ID column is not a number.
    """
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith('"ID"')), None)
    if start is None:
        start = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("ID,")), None)
    if start is None:
        return [], {}
    reader = csv.DictReader(io.StringIO("\n".join(lines[start:])))
    rows, units = [], {}
    for row in reader:
        if not rows and not units and not (row.get("ID") or "").strip().isdigit():
            units = dict(row)
            continue
        if (row.get("ID") or "").strip().isdigit():
            rows.append(row)
    return rows, units


def table_rows(rows: list[dict], units: dict, kernels: list[str] | None) -> list[dict]:
    """One record per profiled kernel: label (v1..v4), name, metric values.

    A kernel is labelled by the awq_v<N> in its name; failing that, by its
    position when ncu saw exactly as many kernels as the driver launched.
    """
    out = []
    for i, row in enumerate(rows):
        name = row.get("Kernel Name") or row.get("Function Name") or "?"
        m = _KERNEL_ID.search(name)
        if m:
            label = f"v{m.group(1)}"
        elif kernels and len(rows) == len(kernels):
            label = kernels[i]
        else:
            label = f"#{i}"
        values = {metric: _number(row.get(metric, "")) for metric, _ in METRICS}
        out.append({"label": label, "kernel_name": name, "values": values,
                    "units": {metric: units.get(metric, "") for metric, _ in METRICS}})
    return out


def _scaled(value, unit: str) -> str:
    if value is None:
        return "-"
    u = (unit or "").lower()
    if u in ("nsecond", "ns"):
        return f"{value / 1000:.1f} us"
    if u in ("usecond", "us"):
        return f"{value:.1f} us"
    if u in ("msecond", "ms"):
        return f"{value * 1000:.1f} us"
    if u in ("byte", "bytes"):
        return f"{value / 2**20:.1f} MiB"
    if u in ("kbyte",):
        return f"{value / 1024:.1f} MiB"
    if u in ("mbyte",):
        return f"{value:.1f} MiB"
    if u in ("gbyte",):
        return f"{value * 1024:.1f} MiB"
    if u == "%":
        return f"{value:.1f}"
    if value == int(value):
        return f"{int(value)}"
    return f"{value:.1f}"


def format_table(records: list[dict]) -> str:
    headers = ["kernel"] + [title for _, title in METRICS]
    rows = [[r["label"]] + [_scaled(r["values"][m], r["units"].get(m, "")) for m, _ in METRICS]
            for r in records]
    names = "\n".join(f"  {r['label']}: {r['kernel_name']}" for r in records)
    return text_table(headers, rows) + "\nkernels:\n" + names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Side-by-side table of an `ncu --csv --page raw` "
                                             "export of the dequantize kernels.")
    ap.add_argument("csv", help="the `ncu --csv --page raw` export")
    ap.add_argument("--kernels", default="v1,v2,v3,v4",
                    help="the kernels in launch order (default v1,v2,v3,v4)")
    ap.add_argument("--json", metavar="PATH", help="also write the table here (default: no JSON)")
    args = ap.parse_args(argv)
    csv_path, json_path = args.csv, args.json
    kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    with open(csv_path, encoding="utf-8", errors="replace") as f:
        rows, units = parse_raw_csv(f.read())
    records = table_rows(rows, units, kernels)
    if not records:
        print(f"no kernel rows found in {csv_path} (did the regex match any kernel?)", file=sys.stderr)
        return 1
    print(format_table(records))
    if json_path:
        with open(json_path, "w", encoding="utf-8") as f:
            json.dump({"source": csv_path, "kernels": records}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
