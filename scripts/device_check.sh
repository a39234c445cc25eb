#!/usr/bin/env bash
# Everything the GPU half needs checked, in one call on a CUDA machine:
# build, the test suite, the compute-sanitizer sweep, the full benchmark, two
# host-only reruns of the benchmark, and the host-time probe.  Full logs go to
# $OUT (default ./device_out); a short summary is printed last.
#
#     OUT=/some/folder bash scripts/device_check.sh
#
# Run from the repository root.  AWQ_FAST_DEQUANT_CUDA_ARCHS (default 90)
# picks the architectures to build.
set -u
R=$PWD
OUT=${OUT:-$R/device_out}
mkdir -p "$OUT"
export AWQ_FAST_DEQUANT_CUDA_ARCHS=${AWQ_FAST_DEQUANT_CUDA_ARCHS:-90}

nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.limit,temperature.gpu,driver_version \
    --format=csv > "$OUT/gpu.txt" 2>&1
git -C "$R" rev-parse --short HEAD > "$OUT/commit.txt" 2>/dev/null
python3 -m pip install --no-build-isolation --no-deps "$R" > "$OUT/checks.log" 2>&1 ||
    { tail -30 "$OUT/checks.log"; exit 1; }

cd /tmp  # import the installed package, not the source folder
python3 -c "import awq_fast_dequant as a; print(a.build_info())" >> "$OUT/checks.log" 2>&1
python3 -m pytest -p no:cacheprovider -q -rs "$R/tests" >> "$OUT/checks.log" 2>&1
echo "pytest rc $?" >> "$OUT/checks.log"
compute-sanitizer --tool memcheck --error-exitcode 1 python3 "$R/scripts/sanitize_sweep.py" \
    >> "$OUT/checks.log" 2>&1
echo "sanitizer rc $?" >> "$OUT/checks.log"

export AWQ_FAST_DEQUANT_CACHE_DIR
AWQ_FAST_DEQUANT_CACHE_DIR=$(mktemp -d)
python3 -m awq_fast_dequant bench --no-progress --sweep --prefill --host-repeats 15 \
    --json "$OUT/h200.json" --plot "$OUT/h200" > "$OUT/bench.txt" 2>&1
echo "bench rc $?" >> "$OUT/bench.txt"
for _ in 1 2; do
    python3 -m awq_fast_dequant bench --no-progress --no-main --host-repeats 15 2>&1 |
        sed -n '/^call (shape/,/^the host work/p' >> "$OUT/host_reruns.txt"
done
python3 "$R/scripts/host_probe.py" > "$OUT/host_probe.txt" 2>&1

# The summary (the device tool returns the end of the output).
grep -E "passed|failed|FAILED|pytest rc|sanitizer rc|ERROR SUMMARY" "$OUT/checks.log" | tail -6
grep -E "copy:|launch floor|bench rc|^[a-z].*[0-9]x[0-9]|^ +v4 " "$OUT/bench.txt" | head -40
sed -n '/^shape       winner/,/^margin/p' "$OUT/bench.txt"
sed -n '/^call (shape/,/^torch baseline/p' "$OUT/bench.txt"
grep -E "floor|out=out\)  |allocating  " "$OUT/host_reruns.txt"
cat "$OUT/host_probe.txt"
