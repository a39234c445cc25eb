"""The host's fused linear against its two yardsticks (DESIGN.md section 7):

- its rate in bytes of packed weights + zeros + scales per second, against
  the rate of np.copyto on a large array (bytes copied per second);
  target: at least 0.5 of it;
- its time against numpy.matmul(x_f32, W_f32) with the dense float32
  weight; target: at least 4 times faster.

Default: the 4096 x 14336 layer, G = 128, float16, M = 1.  Every figure is
the best of --reps runs after a warm-up, and the three are measured in turn
for --rounds rounds, each keeping its best: on a machine shared with other
work, a quiet moment then serves all three alike.

The fused linear runs through awq_fast_dequant.linear(..., path="fused")
when the installed package has it; otherwise (or with --harness) through
the C harness `tests/c/test_linear_cpu.c --bench`, built here with make
(-O3, no sanitizer), which times the default layer only.  The figures are
for this machine's cores: OMP_NUM_THREADS limits the kernel's threads and
NumPy's BLAS alike.

linear() runs the configuration (threads, columns per work item) that the
autotune cache holds for the layer, tuning it on the first call where it
holds none; the script prints the one it ran.  A pick tuned while other
work kept the cores busy can be slower than the defaults: --untuned runs
the defaults (AWQ_FAST_DEQUANT_AUTOTUNE=0), `awq-fast-dequant cache clear`
lets the next run tune again."""

import argparse
import os
import re
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HARNESS_SHAPE = (1, 4096, 14336, 128, "float16")
COPY_BYTES = 256 << 20  # np.copyto's array


def best_s(fn, reps, warmup=2):
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def copyto_rate(reps, nbytes=COPY_BYTES):
    src = np.ones(nbytes, np.uint8)
    dst = np.empty_like(src)
    return nbytes / best_s(lambda: np.copyto(dst, src), reps)


def matmul_fn(M, K, N):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((M, K), dtype=np.float32)
    w = rng.standard_normal((K, N), dtype=np.float32)
    return lambda: np.matmul(x, w)


def numpy_dtype(name):
    if name == "bfloat16":
        import ml_dtypes  # NumPy has no bfloat16 of its own
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def fused_fn(awq, M, K, N, G, dtype):
    rng = np.random.default_rng(0)
    dt = numpy_dtype(dtype)
    qweight = rng.integers(0, 2**32, size=(K, N // 8), dtype=np.uint32).view(np.int32)
    qzeros = rng.integers(0, 2**32, size=(K // G, N // 8), dtype=np.uint32).view(np.int32)
    scales = rng.uniform(1e-3, 1e-2, size=(K // G, N)).astype(dt)
    x = rng.standard_normal((M, K)).astype(dt)
    return lambda: awq.linear(x, qweight, qzeros, scales, path="fused")


def picked_config(awq, M, K, N, G, dtype):
    """The autotune cache's entry linear() ran for this layer, as text."""
    if os.environ.get("AWQ_FAST_DEQUANT_AUTOTUNE", "").lower() in ("0", "false", "off"):
        return "the defaults (AWQ_FAST_DEQUANT_AUTOTUNE=0)"
    bucket = 1 << max(0, (M - 1).bit_length())
    suffix = f" {awq.build_info()['cpu_max_threads']}t"
    for e in awq.cache_entries():
        if (e["op"], e["K"], e["N"], e["G"], e["M"], e["scales_dtype"]) == \
                ("linear", K, N, G, bucket, dtype) and e["device"].startswith("cpu") \
                and e["device"].endswith(suffix):
            if e["kernel"] not in ("cpu", "amx"):
                return f"the defaults (the cache holds kernel {e['kernel']!r} for auto)"
            return (f"kernel={e['kernel']} threads={e['threads'] or 'all'} "
                    f"chunk={e['chunk'] or 'default'} (autotune cache, gen {e['gen']})")
    return "unknown (no autotune cache entry)"


def fused_s_harness(reps, echo):
    exe = os.path.join(ROOT, "build", "test_linear_cpu_bench")
    r = subprocess.run(["make", "-s", "-C", os.path.join(ROOT, "tests", "c"),
                        "../../build/test_linear_cpu_bench"],
                       capture_output=True, text=True, timeout=600)
    if r.returncode == 0:
        r = subprocess.run([exe, "--bench", str(reps)], capture_output=True, text=True,
                           timeout=600)
    if r.returncode != 0:
        sys.exit("the C harness failed:\n" + r.stdout[-2000:] + r.stderr[-2000:])
    m = re.search(r"^time_ms ([0-9.]+)", r.stdout, re.M)
    if not m:
        sys.exit("no time_ms line in the harness's output:\n" + r.stdout[-2000:])
    if echo:
        print("  " + "\n  ".join(r.stdout.strip().splitlines()[:-1]))
    return float(m.group(1)) / 1e3


def main():
    ap = argparse.ArgumentParser(description="The host's fused linear against np.copyto and "
                                 "numpy.matmul with the dense float32 weight.")
    ap.add_argument("--M", type=int, default=1, help="rows of x (default 1)")
    ap.add_argument("--K", type=int, default=4096, help="in_features (default 4096)")
    ap.add_argument("--N", type=int, default=14336, help="out_features (default 14336)")
    ap.add_argument("--G", type=int, default=128, help="group size (default 128)")
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32"))
    ap.add_argument("--reps", type=int, default=20, help="timed runs, best reported (default 20)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of the three measurements, best kept (default 3)")
    ap.add_argument("--harness", action="store_true",
                    help="time the fused linear through the C harness even when "
                         "awq_fast_dequant.linear exists")
    ap.add_argument("--untuned", action="store_true",
                    help="run linear() with its default configuration, not the autotune "
                         "cache's pick (sets AWQ_FAST_DEQUANT_AUTOTUNE=0)")
    args = ap.parse_args()
    if args.untuned:
        os.environ["AWQ_FAST_DEQUANT_AUTOTUNE"] = "0"  # read when the package first tunes
    M, K, N, G = args.M, args.K, args.N, args.G
    if N % 8 or K % G:
        ap.error("N must be a multiple of 8 and G must divide K")

    awq = None
    if not args.harness:
        try:
            import awq_fast_dequant as awq
        except ImportError:
            awq = None
        if awq is not None and not hasattr(awq, "linear"):
            awq = None
    if awq is None and (M, K, N, G, args.dtype) != HARNESS_SHAPE:
        ap.error("the C harness times M=1 K=4096 N=14336 G=128 float16 only; "
                 "other shapes need awq_fast_dequant.linear")

    scale_bytes = numpy_dtype(args.dtype).itemsize
    packed = K * N // 2 + 4 * (K // G) * (N // 8) + scale_bytes * (K // G) * N
    print(f"M={M} K={K} N={N} G={G} {args.dtype}, {os.cpu_count()} CPUs, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")

    # the inputs are built once; each round times the same arrays
    matmul = matmul_fn(M, K, N)
    if awq is not None:
        how = "awq_fast_dequant.linear(path='fused')"
        linear = fused_fn(awq, M, K, N, G, args.dtype)
    else:
        how = "the C harness (tests/c/test_linear_cpu.c --bench)"
    copy, mm, fused = 0.0, float("inf"), float("inf")
    for r in range(max(1, args.rounds)):
        copy = max(copy, copyto_rate(args.reps))
        mm = min(mm, best_s(matmul, args.reps))
        if awq is not None:
            fused = min(fused, best_s(linear, args.reps))
        else:
            fused = min(fused, fused_s_harness(args.reps, echo=r == 0))

    rate = packed / fused
    print(f"fused linear, through {how}: {fused * 1e3:.3f} ms, "
          f"{rate / 1e9:.2f} GB/s of packed weights+zeros+scales ({packed / 1e6:.1f} MB)")
    if awq is not None:
        print(f"  configuration: {picked_config(awq, M, K, N, G, args.dtype)}")
    print(f"np.copyto of {COPY_BYTES >> 20} MiB: {copy / 1e9:.2f} GB/s")
    print(f"numpy.matmul(x_f32, W_f32): {mm * 1e3:.3f} ms")
    print(f"packed rate / copyto rate: {rate / copy:.2f}  (target >= 0.5)")
    print(f"matmul time / fused time:  {mm / fused:.2f}  (target >= 4)")


if __name__ == "__main__":
    main()
