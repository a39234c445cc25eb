#!/usr/bin/env bash
# Everything the GPU half needs checked, in one call on a CUDA machine:
# build, the test suite, the compute-sanitizer sweep, the full benchmark, four
# host-only reruns of the benchmark (two per launch path), the host-time
# probe with AWQLinear's call (scripts/module_call_ab.py), the linear benchmark
# (bench --linear), the decoder-layer, mixture-of-
# experts and conversion benchmarks, the read-only floor (scripts/read_floor.py) and, on
# compute capability 9.0, the warpgroup probe (scripts/wgmma_probe.cu) and the
# three prefill probes (scripts/prefill_smem_probe.py, scripts/prefill_overlap_probe.py,
# scripts/prefill_reg_probe.py) and the prepared-layout kernel over M
# (scripts/prefill_prepared_bench.py).
# Full logs go to $OUT (default ./device_out); a short summary is printed last.
#
#     COMMIT=$(git rev-parse --short HEAD) OUT=/some/folder bash scripts/device_check.sh
#
# Run from the repository root.  AWQ_FAST_DEQUANT_CUDA_ARCHS (default 90)
# picks the architectures to build.  The whole check takes longer than one
# 10-minute device call, so it comes in parts: PART=checks runs the build, the
# tests but those of the PyTorch integration, its two AOTInductor tests (about
# four minutes on an H200 host: they compile C++ in child processes) and the
# sanitizers; PART=torch the build and the rest of tests/test_torch.py and
# tests/test_torch_hf.py (about five minutes: torch.compile); PART=bench the
# build and the benchmarks (all three: PART=all, the default); PART=probes the
# build and the sm_90a probes alone (wgmma_probe.txt, prefill_smem.txt,
# prefill_prepared.txt); PART=parallel the build, the tests but the AOTInductor
# ones and the memcheck sweeps at once, then the decoder-layer and
# prepared-layout benchmarks; PART=prefill the same for the prefill kernel alone
# (tests/test_prefill.py and the memcheck sweep of the fused linear and that
# kernel, then the two benchmarks: 151 s on an H200 host, build included).
set -u
R=$PWD
OUT=${OUT:-$R/device_out}
PART=${PART:-all}
mkdir -p "$OUT"
export AWQ_FAST_DEQUANT_CUDA_ARCHS=${AWQ_FAST_DEQUANT_CUDA_ARCHS:-90}
export PYTHONUNBUFFERED=1

# Seven files for the dequantize half (bench.txt, checks.log, host.txt,
# h200.json, three plots); the linear half adds bench_linear.txt,
# h200_linear.json and one plot per layer (h200_linear_*.png, nine).
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.limit,temperature.gpu,driver_version \
    --format=csv > "$OUT/checks.log" 2>&1
# A copied tree may carry a stale .git: the caller names the commit.
echo "commit: ${COMMIT:-not given (pass COMMIT=...)}" >> "$OUT/checks.log"
python3 -m pip install --no-build-isolation --no-deps "$R" >> "$OUT/checks.log" 2>&1 ||
    { tail -30 "$OUT/checks.log"; exit 1; }

cd /tmp  # import the installed package, not the source folder
python3 -c "import awq_fast_dequant as a; print(a.build_info())" >> "$OUT/checks.log" 2>&1
TORCH_TESTS="$R/tests/test_torch.py $R/tests/test_torch_fuse.py $R/tests/test_torch_hf.py"
if [ "$PART" = parallel ] || [ "$PART" = prefill ]; then
# The tests (less the two AOTInductor ones, which compile C++ for minutes: PART=checks)
# and the memcheck sweeps as five processes at once on the one GPU (correctness
# only: nothing here is timed), then the decoder-layer and prepared-layout
# benchmarks alone.  On an H200 host, sharing it four ways, tests/test_torch.py took
# 112 s; the CPU-bound quantizer tests (test_quant, the MiniLM ones) take the longest,
# so they have a process of their own.  TEST_TIMEOUT (default 400 s) bounds each
# process, so that the call fits 10 minutes.  Logs: tests_*.log, memcheck.log,
# decoder.txt, prefill_prepared.txt.
T=${TEST_TIMEOUT:-400}
Q="-p no:cacheprovider -q -rs"
HEAVY="$R/tests/test_quant.py $R/tests/test_minilm.py $R/tests/test_convert_minilm.py"
# shellcheck disable=SC2086
{
if [ "$PART" = prefill ]; then
timeout "$T" python3 -m pytest $Q "$R/tests/test_prefill.py" > "$OUT/tests_prefill.log" 2>&1 &
{ timeout "$T" compute-sanitizer --tool memcheck --error-exitcode 1 python3 "$R/scripts/linear_sanitize.py"
  echo "linear memcheck rc $?"; } > "$OUT/memcheck.log" 2>&1 &
else
timeout "$T" python3 -m pytest $Q -k "not aotinductor" "$R/tests/test_torch.py" > "$OUT/tests_torch.log" 2>&1 &
timeout "$T" python3 -m pytest $Q "$R/tests/test_torch_fuse.py" "$R/tests/test_torch_hf.py" \
    "$R/tests/test_prefill.py" > "$OUT/tests_fuse_hf_prefill.log" 2>&1 &
timeout "$T" python3 -m pytest $Q $HEAVY > "$OUT/tests_quant.log" 2>&1 &
IGNORE=
for f in $TORCH_TESTS "$R/tests/test_prefill.py" $HEAVY; do IGNORE="$IGNORE --ignore=$f"; done
timeout "$T" python3 -m pytest $Q "$R/tests" $IGNORE > "$OUT/tests_core.log" 2>&1 &
{ timeout "$T" compute-sanitizer --tool memcheck --error-exitcode 1 python3 "$R/scripts/linear_sanitize.py"
  echo "linear memcheck rc $?"
  timeout "$T" compute-sanitizer --tool memcheck --error-exitcode 1 python3 "$R/scripts/sanitize_sweep.py"
  echo "sanitizer rc $?"; } > "$OUT/memcheck.log" 2>&1 &
fi
wait
}
for f in "$OUT"/tests_*.log; do
    summary=$(grep -E "[0-9]+ (passed|failed)" "$f" | tail -1)
    echo "$(basename "$f"): ${summary:-did not finish within $T s}"
done
grep -E "checked|rc [0-9]|ERROR SUMMARY" "$OUT/memcheck.log"
python3 "$R/scripts/decoder_layer_bench.py" --trials 11 > "$OUT/decoder.txt" 2>&1
echo "decoder bench rc $?" >> "$OUT/decoder.txt"
grep -E "ratio|^host us|rc [0-9]" "$OUT/decoder.txt"
(cd "$R/scripts" && python3 prefill_prepared_bench.py) > "$OUT/prefill_prepared.txt" 2>&1
echo "prefill prepared bench rc $?" >> "$OUT/prefill_prepared.txt"
cat "$OUT/prefill_prepared.txt"
exit 0
fi
if [ "$PART" = torch ] || [ "$PART" = all ]; then
# shellcheck disable=SC2086
python3 -m pytest -p no:cacheprovider -q -rs --durations=5 -k "not aotinductor" $TORCH_TESTS \
    >> "$OUT/checks.log" 2>&1
echo "pytest (PyTorch integration) rc $?" >> "$OUT/checks.log"
grep -E "passed|failed|FAILED|rc [0-9]" "$OUT/checks.log" | tail -4
fi
[ "$PART" = torch ] && exit 0
if [ "$PART" != bench ] && [ "$PART" != probes ]; then
python3 -m pytest -p no:cacheprovider -q -rs "$R/tests" --ignore="$R/tests/test_torch.py" \
    --ignore="$R/tests/test_torch_hf.py" >> "$OUT/checks.log" 2>&1
echo "pytest rc $?" >> "$OUT/checks.log"
python3 -m pytest -p no:cacheprovider -q -rs -k aotinductor "$R/tests/test_torch.py" \
    >> "$OUT/checks.log" 2>&1
echo "pytest (AOTInductor) rc $?" >> "$OUT/checks.log"
compute-sanitizer --tool memcheck --error-exitcode 1 python3 "$R/scripts/sanitize_sweep.py" \
    >> "$OUT/checks.log" 2>&1
echo "sanitizer rc $?" >> "$OUT/checks.log"
# the fused linear: every branch of its kernels, under each checker
for tool in memcheck racecheck synccheck; do
    quick=; [ $tool = memcheck ] || quick=--quick
    compute-sanitizer --tool $tool --error-exitcode 1 python3 "$R/scripts/linear_sanitize.py" $quick \
        >> "$OUT/checks.log" 2>&1
    echo "linear $tool rc $?" >> "$OUT/checks.log"
done
grep -E "passed|failed|FAILED|pytest rc|sanitizer rc|rc [0-9]|ERROR SUMMARY" "$OUT/checks.log" | tail -12
fi
[ "$PART" = checks ] && exit 0

if [ "$PART" != probes ]; then
export AWQ_FAST_DEQUANT_CACHE_DIR
AWQ_FAST_DEQUANT_CACHE_DIR=$(mktemp -d)
python3 -m awq_fast_dequant bench --no-progress --sweep --prefill --host-repeats 15 \
    --json "$OUT/h200.json" --plot "$OUT/h200" > "$OUT/bench.txt" 2>&1
echo "bench rc $?" >> "$OUT/bench.txt"
# Host-only reruns, alternating the launch path: the driver's cuLaunchKernel
# (the default) and the runtime's cudaLaunchKernel (the fallback).
for path in driver runtime driver runtime; do
    echo "launch path: $path" >> "$OUT/host.txt"
    [ $path = runtime ] && export AWQ_FAST_DEQUANT_RUNTIME_LAUNCH=1
    python3 -m awq_fast_dequant bench --no-progress --no-main --host-repeats 15 2>&1 |
        sed -n '/^call (shape/,/^kernels launched through/p' >> "$OUT/host.txt"
    unset AWQ_FAST_DEQUANT_RUNTIME_LAUNCH
done
python3 "$R/scripts/host_probe.py" > "$OUT/host_probe.tmp" 2>&1
# AWQLinear over linear(): its eager call in C against the checks in Python.
python3 "$R/scripts/module_call_ab.py" >> "$OUT/host_probe.tmp" 2>&1
# linear(): every path against the dense matmul over M, the targets' verdict.
# The host overhead of linear() is in the runs above; the autotune cache is
# the same fresh one, so auto tunes here.
python3 -m awq_fast_dequant bench --linear --no-progress --no-host \
    --json "$OUT/h200_linear.json" --plot "$OUT/h200" > "$OUT/bench_linear.txt" 2>&1
echo "bench --linear rc $?" >> "$OUT/bench_linear.txt"

# A Llama-3-8B decoder layer (AWQLinear against nn.Linear), eager and under
# torch.compile, with the kernels of one replay of each step, the bound of
# read-only projections and the decode step without a CUDA graph; the
# checkpoint converter on a synthetic 8B-sized checkpoint.
python3 "$R/scripts/decoder_layer_bench.py" --compile --breakdown --read-floor --no-graph > "$OUT/decoder.txt" 2>&1
echo "decoder bench rc $?" >> "$OUT/decoder.txt"
# A Mixtral-8x7B mixture-of-experts block: AWQ experts (UnfusedExperts) against
# transformers' fused dense ones.
python3 "$R/scripts/moe_bench.py" > "$OUT/moe.txt" 2>&1
echo "moe bench rc $?" >> "$OUT/moe.txt"
python3 "$R/scripts/convert_bench.py" --device cuda > "$OUT/convert.txt" 2>&1
echo "convert bench rc $?" >> "$OUT/convert.txt"
# The decode kernel against a kernel that only reads the packed weights.
python3 "$R/scripts/read_floor.py" > "$OUT/read_floor.txt" 2>&1
echo "read floor rc $?" >> "$OUT/read_floor.txt"
fi

# The warpgroup kernel's issue pattern on the tensor cores (sm_90a only).
if nvidia-smi --query-gpu=compute_cap --format=csv,noheader | grep -q '^9\.0'; then
    nvcc -O3 -std=c++17 -I "$R/csrc" -gencode arch=compute_90a,code=sm_90a "$R/scripts/wgmma_probe.cu" -o /tmp/wgmma_probe &&
        /tmp/wgmma_probe > "$OUT/wgmma_probe.txt" 2>&1
    echo "wgmma probe rc $?" >> "$OUT/wgmma_probe.txt"
    # A prefill GEMM with W dequantized into shared memory, against dense.
    python3 "$R/scripts/prefill_smem_probe.py" > "$OUT/prefill_smem.txt" 2>&1
    echo "prefill smem probe rc $?" >> "$OUT/prefill_smem.txt"
    # The next projection dequantized beside the GEMM, on a second stream (same file:
    # few files come back from a device call).
    python3 "$R/scripts/prefill_overlap_probe.py" 2>&1 | grep -v "Warning: " >> "$OUT/prefill_smem.txt"
    echo "prefill overlap probe rc ${PIPESTATUS[0]}" >> "$OUT/prefill_smem.txt"
    # W from a layout prepared for each lane, loaded straight into wgmma's A registers.
    python3 "$R/scripts/prefill_reg_probe.py" >> "$OUT/prefill_smem.txt" 2>&1
    echo "prefill reg probe rc $?" >> "$OUT/prefill_smem.txt"
    # The package's prepared-layout kernel (prepare_prefill) against linear() and dense, over M.
    (cd "$R/scripts" && python3 prefill_prepared_bench.py) > "$OUT/prefill_prepared.txt" 2>&1
    echo "prefill prepared bench rc $?" >> "$OUT/prefill_prepared.txt"
fi

# The summary (the device tool returns the end of the output).
if [ "$PART" != probes ]; then
grep -E "copy:|launch floor|bench rc|^[a-z].*[0-9]x[0-9]|^ +v4 " "$OUT/bench.txt" | head -40
sed -n '/^shape       winner/,/^margin/p' "$OUT/bench.txt"
sed -n '/^call (shape/,/^torch baseline/p' "$OUT/bench.txt"
grep -E "launch path|launched through|floor|out=out\)  |allocating  |^linear\(" "$OUT/host.txt"
cat "$OUT/host_probe.tmp"
cat "$OUT/host_probe.tmp" >> "$OUT/host.txt"
rm -f "$OUT/host_probe.tmp"
sed -n '/^Dispatcher choice per M/,/^the kernel of each/p' "$OUT/bench_linear.txt"
sed -n '/^Verdict: the targets/,/^result:/p' "$OUT/bench_linear.txt" | head -45
grep -E "^bench --linear rc" "$OUT/bench_linear.txt"
grep -E "ratio|^host us|rc [0-9]" "$OUT/decoder.txt"
grep -E "^tokens|rc [0-9]" "$OUT/moe.txt"
tail -8 "$OUT/convert.txt"
cat "$OUT/read_floor.txt"
fi
[ -f "$OUT/wgmma_probe.txt" ] && tail -6 "$OUT/wgmma_probe.txt"
[ -f "$OUT/prefill_prepared.txt" ] && cat "$OUT/prefill_prepared.txt"
[ -f "$OUT/prefill_smem.txt" ] &&
    grep -E "^(dense|linear|dequant\+mm|smem[0-9]+|ahead-st-40|r(128|256)/s[0-9]) |^(best|mix|all in one graph):|rc [0-9]" \
        "$OUT/prefill_smem.txt"
