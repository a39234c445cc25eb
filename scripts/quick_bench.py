"""Quick GPU checks that `python -m awq_fast_dequant bench` does not make (a
development tool; the published numbers come from the benchmark):

- v4 over block sizes x rows per thread (`--sweep`; rows are internal, so
  the benchmark's own sweep covers block sizes only);
- smart_dequantize's first call for a new shape (it tunes) against a cache hit.

Timing is the benchmark's: cold L2, CUDA events around one launch, median of
`--reps`; % of a device-to-device copy measured here too."""

import argparse
import os
import statistics
import tempfile
import time

import torch

import awq_fast_dequant as awq
from awq_fast_dequant.bench import (PRESETS, CudaTimer, bytes_moved, cuda_case,
                                    cuda_copy_bandwidth, launch_config, make_inputs)

SHAPES = [shape for preset in PRESETS.values() for shape in preset]
G = 128


def inputs(K, N, dtype, dev):
    c = cuda_case(torch, dev, K, N, G, dtype, make_inputs(K, N, G, dtype, seed=0))
    return c.qweight, c.qzeros, c.scales, c.out


def main():
    ap = argparse.ArgumentParser(description="Quick GPU checks the benchmark does not make.")
    ap.add_argument("--reps", type=int, default=30, help="timed launches per median (default 30)")
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32"),
                    help="scales and output dtype (default float16)")
    ap.add_argument("--sweep", action="store_true",
                    help="also time v4 over block sizes x rows (default off)")
    args = ap.parse_args()
    # A fresh autotune cache, so that smart_dequantize's first call tunes. The
    # folder is read at the cache's first use, which comes later.
    os.environ["AWQ_FAST_DEQUANT_CACHE_DIR"] = tempfile.mkdtemp()
    dev = torch.device("cuda")
    timer = CudaTimer(torch, dev, 512 << 20)

    def median_us(fn):
        fn()
        return statistics.median(timer.run(fn, args.reps)[0])

    if args.sweep:
        copy_gbps = cuda_copy_bandwidth(torch, dev, timer, 1 << 30, runs=10)["gbps"]
        print(f"{torch.cuda.get_device_name()}  copy {copy_gbps:.0f} GB/s")
        for K, N in SHAPES:
            qw, qz, sc, out = inputs(K, N, args.dtype, dev)
            pct = 100 * bytes_moved(K, N, G, args.dtype) / 1e3 / copy_gbps
            res = sorted((median_us(lambda b=block, r=rows: launch_config(
                              qw, qz, sc, out, "v4", b, r)), block, rows)
                         for block in (64, 128, 256, 512) for rows in (2, 4, 8))
            print(f"{K:>5}x{N:<6} best: " + ", ".join(
                f"b{b} r{r} {us:.2f}us ({pct / us:.0f}%)" for us, b, r in res[:4]), flush=True)

    # smart_dequantize: first call for a new shape (tunes) vs a cache hit
    for K, N in SHAPES:
        qw, qz, sc, out = inputs(K, N, args.dtype, dev)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        awq.smart_dequantize(qw, qz, sc, out=out)
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        hits = []
        for _ in range(20):
            t0 = time.perf_counter()
            awq.smart_dequantize(qw, qz, sc, out=out)
            torch.cuda.synchronize()
            hits.append(time.perf_counter() - t0)
        hit = statistics.median(hits)
        print(f"smart {K:>5}x{N:<6} first call {first * 1e3:7.1f} ms   hit {hit * 1e6:7.1f} us   "
              f"ratio {first / hit:7.0f}x", flush=True)
    for e in sorted(awq.cache_entries(), key=lambda e: (e["K"], e["N"])):
        print(f"  tuned {e['K']}x{e['N']}: {e['kernel']} block {e['block_size']} rows {e['rows']} "
              f"{e['us']:.2f} us")


if __name__ == "__main__":
    main()
