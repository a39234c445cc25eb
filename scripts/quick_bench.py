"""Quick GPU timing of v1..v4 on the DESIGN.md shapes (a development tool; the
published numbers come from `python -m awq_fast_dequant bench`).

Cold L2 (a 512 MiB memset before each timed launch), CUDA events around one
launch, median of `--reps`; % of a device-to-device copy measured here too.
Also host microseconds per call with the GPU kept busy."""

import argparse
import statistics
import time

import torch

import awq_fast_dequant as awq

SHAPES = [(1536, 1536), (1536, 8960), (8960, 1536), (4096, 4096), (4096, 14336),
          (14336, 4096), (8192, 8192), (8192, 28672), (28672, 8192)]


def timed(fn, flush, reps):
    ts = []
    for _ in range(reps):
        flush.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--kernels", default="v1,v2,v3,v4")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--sweep", action="store_true", help="v4 over block sizes x rows")
    args = ap.parse_args()
    dt = getattr(torch, args.dtype)
    flush = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_us = timed(lambda: dst.copy_(src), flush, 10)
    copy_bw = 2 * src.numel() / copy_us / 1e3
    print(f"{torch.cuda.get_device_name()}  copy {copy_bw:.0f} GB/s")
    del src, dst
    kernels = args.kernels.split(",")
    print(f"{'shape':>12} " + " ".join(f"{k + ' us':>9} {'%':>4}" for k in kernels))
    G = 128
    for K, N in SHAPES:
        qw = torch.randint(-2**31, 2**31 - 1, (K, N // 8), dtype=torch.int32, device="cuda")
        qz = torch.randint(-2**31, 2**31 - 1, (K // G, N // 8), dtype=torch.int32, device="cuda")
        sc = torch.randn((K // G, N), device="cuda").to(dt)
        out = torch.empty((K, N), dtype=dt, device="cuda")
        s = sc.element_size()
        nbytes = K * N / 2 + 4 * (K // G) * (N // 8) + s * (K // G) * N + s * K * N
        row = []
        for k in kernels:
            fn = lambda: awq.dequantize(qw, qz, sc, out=out, kernel=k)
            fn()
            us = timed(fn, flush, args.reps)
            row.append(f"{us:9.2f} {100 * nbytes / us / 1e3 / copy_bw:4.0f}")
        print(f"{K:>5}x{N:<6} " + " ".join(row), flush=True)
        if args.sweep:
            res = []
            for block in (128, 256, 512):
                for rows in (2, 4, 8):
                    fn = lambda: awq._C._launch_config(qw, qz, sc, out, "v4", block, rows)
                    fn()
                    res.append((timed(fn, flush, args.reps), block, rows))
            res.sort()
            print("    sweep best: " + ", ".join(f"b{b} r{r} {us:.2f}us ({100 * nbytes / us / 1e3 / copy_bw:.0f}%)"
                                           for us, b, r in res[:4]), flush=True)
    # smart_dequantize: first call for a new shape (tunes) vs a cache hit
    import os
    import tempfile
    os.environ["AWQ_FAST_DEQUANT_CACHE_DIR"] = tempfile.mkdtemp()
    awq._C._cache_reload()
    for K, N in SHAPES:
        qw = torch.randint(-2**31, 2**31 - 1, (K, N // 8), dtype=torch.int32, device="cuda")
        qz = torch.randint(-2**31, 2**31 - 1, (K // G, N // 8), dtype=torch.int32, device="cuda")
        sc = torch.randn((K // G, N), device="cuda").to(dt)
        out = torch.empty((K, N), dtype=dt, device="cuda")
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

    # host overhead with the GPU kept busy
    K, N = 1536, 1536
    qw = torch.randint(-2**31, 2**31 - 1, (K, N // 8), dtype=torch.int32, device="cuda")
    qz = torch.randint(-2**31, 2**31 - 1, (K // G, N // 8), dtype=torch.int32, device="cuda")
    sc = torch.randn((K // G, N), device="cuda").half()
    out = torch.empty((K, N), dtype=torch.half, device="cuda")
    e_qw, e_qz, e_sc = qw[:0], qz[:0], sc[:0]
    e_out = out[:0]
    for name, fn in (("empty (no launch)", lambda: awq.dequantize(e_qw, e_qz, e_sc, group_size=128, out=e_out)),
                     ("dequantize(out=)", lambda: awq.dequantize(qw, qz, sc, out=out)),
                     ("dequantize()", lambda: awq.dequantize(qw, qz, sc)),
                     ("smart(out=)", lambda: awq.smart_dequantize(qw, qz, sc, out=out)),
                     ("torch add_", lambda: out.add_(1))):
        fn()
        res = []
        for _ in range(5):
            torch.cuda.synchronize()
            torch.cuda._sleep(100_000_000)
            t0 = time.perf_counter_ns()
            for _ in range(200):
                fn()
            res.append((time.perf_counter_ns() - t0) / 200 / 1e3)
        torch.cuda.synchronize()
        print(f"host {name:>18}: {statistics.median(res):.2f} us/call")


if __name__ == "__main__":
    main()
