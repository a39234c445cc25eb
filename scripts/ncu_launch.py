"""What scripts/ncu_profile.sh runs under Nsight Compute: each of the given
CUDA kernels launched once on one layer, in order, on the benchmark's data.

    python3 scripts/ncu_launch.py [--shape 4096x14336:128] [--dtype float16] [--kernels v1,v2,v3,v4]
"""

import argparse
import sys

import torch

import awq_fast_dequant as awq
from awq_fast_dequant.bench import cuda_case, make_inputs

KERNELS = ("v1", "v2", "v3", "v4")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Launch each dequantize kernel once, for ncu.")
    ap.add_argument("--shape", default="4096x14336:128",
                    help="KxN:G of the layer (default 4096x14336:128)")
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32"),
                    help="scales and output dtype (default float16)")
    ap.add_argument("--kernels", default=",".join(KERNELS),
                    help="kernels to launch, in this order (default v1,v2,v3,v4)")
    ap.add_argument("--device", default="cuda", help="the CUDA device (default cuda)")
    args = ap.parse_args(argv)
    try:
        body, _, g = args.shape.lower().partition(":")
        K, N = (int(v) for v in body.split("x"))
        G = int(g) if g else 128
    except ValueError:
        ap.error(f"--shape: KxN or KxN:G expected; got {args.shape!r}")
    kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    bad = [k for k in kernels if k not in KERNELS]
    if bad or not kernels:
        ap.error(f"--kernels: choose among {', '.join(KERNELS)}; got {args.kernels!r}")
    if not torch.cuda.is_available() or not awq.cuda_available():
        print("ncu_launch: needs a CUDA GPU and a CUDA build of awq_fast_dequant", file=sys.stderr)
        return 2
    dev = torch.device(args.device)
    case = cuda_case(torch, dev, K, N, G, args.dtype, make_inputs(K, N, G, args.dtype, seed=0))
    torch.cuda.synchronize(dev)
    for k in kernels:
        awq.dequantize(case.qweight, case.qzeros, case.scales, group_size=G, out=case.out, kernel=k)
        torch.cuda.synchronize(dev)
        print(f"ncu_launch: launched {k} on {K}x{N} G={G} {args.dtype}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
