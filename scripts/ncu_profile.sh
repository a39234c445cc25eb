#!/usr/bin/env bash
# Nsight Compute profile of the CUDA kernels v1..v4 on one layer shape, printed
# side by side: duration, DRAM throughput %, L1/TEX throughput %, achieved and
# theoretical occupancy, registers per thread, launch shape, DRAM bytes.
#
# usage: scripts/ncu_profile.sh [KxN] [G] [dtype] [out_dir]
#   defaults: 4096x14336 128 float16 ncu_out
# environment:
#   NCU=/path/to/ncu        (default: ncu on PATH, else /usr/local/cuda/bin/ncu or
#                           the newest /opt/nvidia/nsight-compute/*/ncu)
#   PYTHON=python3          the interpreter that imports awq_fast_dequant
#   KERNELS=v1,v2,v3,v4     kernels to launch, in this order
#   KERNEL_REGEX='awq_v[1-4]'  ncu's kernel-name filter
#
# Clocks are left as the GPU runs them (--clock-control none), as in the
# benchmark; ncu's default cache control flushes the caches before every
# profiled kernel, so each one starts cold, also as in the benchmark.
set -euo pipefail

shape=${1:-4096x14336}
group=${2:-128}
dtype=${3:-float16}
outdir=${4:-ncu_out}
here=$(cd "$(dirname "$0")" && pwd)  # ncu_launch.py and ncu_table.py sit beside this script
PYTHON=${PYTHON:-python3}
# Never import the package from a source checkout in the current folder (it
# has no compiled _C): Python 3.11+ then leaves the cwd off sys.path.
export PYTHONSAFEPATH=1
KERNELS=${KERNELS:-v1,v2,v3,v4}
KERNEL_REGEX=${KERNEL_REGEX:-awq_v[1-4]}

NCU=${NCU:-$(command -v ncu || true)}
if [[ -z "$NCU" ]]; then
    for candidate in /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu; do
        if [[ -x "$candidate" ]]; then NCU=$candidate; fi
    done
fi
if [[ -z "$NCU" ]]; then
    echo "ncu (Nsight Compute) not found: put it on PATH or set NCU=/path/to/ncu" >&2
    exit 2
fi

# Must match METRICS in scripts/ncu_table.py (the table's columns).
metrics=(
    gpu__time_duration.sum
    dram__throughput.avg.pct_of_peak_sustained_elapsed
    l1tex__throughput.avg.pct_of_peak_sustained_active
    sm__warps_active.avg.pct_of_peak_sustained_active
    sm__maximum_warps_per_active_cycle_pct
    launch__registers_per_thread
    launch__block_size
    launch__grid_size
    dram__bytes_read.sum
    dram__bytes_write.sum
)
metric_list=$(IFS=,; echo "${metrics[*]}")

mkdir -p "$outdir"
report="$outdir/awq_${shape}_g${group}_${dtype}"

echo "profiling $KERNELS on ${shape} G=${group} ${dtype} with $NCU" >&2
"$NCU" --clock-control none \
    --target-processes all \
    --kernel-name "regex:${KERNEL_REGEX}" \
    --metrics "$metric_list" \
    --export "$report" --force-overwrite \
    "$PYTHON" "$here/ncu_launch.py" --shape "${shape}:${group}" --dtype "$dtype" \
        --kernels "$KERNELS"

# Raw page, one row per kernel launch; base units (ns, bytes) where this ncu
# has --print-units (the table reads the units row either way).
if ! "$NCU" --import "${report}.ncu-rep" --csv --page raw --print-units base > "${report}.csv"; then
    "$NCU" --import "${report}.ncu-rep" --csv --page raw > "${report}.csv"
fi

"$PYTHON" "$here/ncu_table.py" "${report}.csv" --kernels "$KERNELS" --json "${report}.json"
echo "report: ${report}.ncu-rep, ${report}.csv, ${report}.json" >&2
