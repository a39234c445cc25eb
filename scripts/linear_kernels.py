"""Each fused CUDA kernel's best configuration on a layer, against the other paths.

    python3 scripts/linear_kernels.py [--layers 4096x14336,8192x28672] [--m 33,64,128]
                                      [--kernels wgmma,mma] [--dtype float16]

For every layer (K x N, G = 128) and M: each kernel named in --kernels over
every candidate configuration the tuner would try (bench.linear_candidates),
its best median with that configuration, then linear(path="dequant") and the
dense matmul x @ W (torch.matmul with W dequantized once), all timed in the
same process with the benchmark's timer (bench.CudaTimer: a 256 MiB memset
before each timed launch, CUDA events), medians of 3 x 5.  A development tool
for choosing kernels and defaults; docs/KERNELS.md quotes its tables.  Run it
from outside the source folder (cd /tmp) so that Python imports the
installed package."""

import argparse
import statistics
import sys

DEFAULT_LAYERS = "4096x14336,14336x4096,8192x28672,28672x8192,4096x4096,1536x8960"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", default=DEFAULT_LAYERS, help=f"comma list of KxN (default {DEFAULT_LAYERS})")
    ap.add_argument("--m", default="33,64,128,256,1024,4096", help="comma list of M (default 33,...,4096)")
    ap.add_argument("--kernels", default="wgmma,mma", help="fused kernels to search (default wgmma,mma)")
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    args = ap.parse_args()

    import numpy as np
    import torch

    import awq_fast_dequant as awq
    from awq_fast_dequant.bench import CudaTimer, linear_candidates, linear_config, make_inputs

    if not awq.cuda_available():
        print("no CUDA device, or a CPU-only build", file=sys.stderr)
        return 2
    dev = torch.device("cuda", 0)
    dt = getattr(torch, args.dtype)
    timer = CudaTimer(torch, dev, 256 << 20)
    kernels = [k for k in args.kernels.split(",") if k]

    def median_us(fn):
        fn()
        samples = []
        for _ in range(3):
            samples += timer.run(fn, 5)[0]
        return statistics.median(samples)

    for layer in args.layers.split(","):
        K, N = (int(v) for v in layer.split("x"))
        qw, qz, sc = (torch.from_numpy(np.asarray(a)).to(dev) for a in make_inputs(K, N, 128, args.dtype, 0))
        w = awq.dequantize(qw, qz, sc)
        for M in (int(v) for v in args.m.split(",")):
            x = torch.randn((M, K), device=dev).to(dt)
            y = torch.empty((M, N), dtype=dt, device=dev)
            best = {}
            for c in linear_candidates(x, qw, qz, sc):
                if c["kernel"] not in kernels:
                    continue
                t = median_us(lambda: linear_config(x, qw, qz, sc, None, y, c))
                if c["kernel"] not in best or t < best[c["kernel"]][0]:
                    best[c["kernel"]] = (t, c)
            dq = median_us(lambda: awq.linear(x, qw, qz, sc, path="dequant"))
            dense = median_us(lambda: torch.matmul(x, w))
            parts = [f"{layer} M={M}:"]
            for k in kernels:
                if k in best:
                    t, c = best[k]
                    parts.append(f"{k} {t:.2f} (block_size {c['block_size']}, rows {c['rows']}, split {c['split']})")
                else:
                    parts.append(f"{k} -")
            parts.append(f"dequant {dq:.2f} dense {dense:.2f}")
            print("  ".join(parts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
