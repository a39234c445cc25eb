"""A small sweep of every CUDA kernel, for `compute-sanitizer --tool memcheck`.

    compute-sanitizer --tool memcheck --error-exitcode 1 python3 scripts/sanitize_sweep.py

Covers tails (N = 8, 136), one group and G = K, misaligned views, every
dtype pair, a layer large enough for v4's write-back mode and its prefetch,
and checks each result against the reference."""

import sys

import numpy as np
import torch

import awq_fast_dequant as awq
from awq_fast_dequant import reference
from awq_fast_dequant.bench import launch_config

DTYPES = ("float16", "bfloat16", "float32")


def main() -> int:
    rng = np.random.default_rng(0)
    n = 0
    for K, N, G in ((32, 8, 32), (64, 136, 32), (40, 24, 40), (256, 1032, 128)):
        qw = rng.integers(0, 2**32, (K, N // 8), dtype=np.uint64).astype(np.uint32).view(np.int32)
        qz = rng.integers(0, 2**32, (K // G, N // 8), dtype=np.uint64).astype(np.uint32).view(np.int32)
        sc = rng.standard_normal((K // G, N)).astype(np.float32)
        for sdt in DTYPES:
            for odt in DTYPES:
                for offset in (0, 1):
                    def place(a, dtype=None):
                        t = torch.from_numpy(a).to("cuda", dtype) if dtype else torch.from_numpy(a).cuda()
                        flat = torch.empty(t.numel() + offset, dtype=t.dtype, device="cuda")
                        v = flat[offset:].view(t.shape)
                        v.copy_(t)
                        return v
                    t = (place(qw), place(qz), place(sc, getattr(torch, sdt)))
                    expect = reference.dequantize(*t, out_dtype=odt)
                    for kernel in ("v1", "v2", "v3", "v4"):
                        got = awq.dequantize(*t, out_dtype=odt, kernel=kernel)
                        torch.cuda.synchronize()
                        reference.assert_bitexact(got, expect)
                        n += 1
                    if sdt == odt:  # v4's general kernel: 16 rows a thread, short tiles
                        got = t[2].new_empty((K, N))
                        launch_config(*t, got, "v4", 96, 16)
                        torch.cuda.synchronize()
                        reference.assert_bitexact(got, expect)
                        n += 1
    # Outputs over 8 MB: the write-back mode, whose threads prefetch the rows of
    # the unit one wave ahead; W = 1025 leaves one lane in each tile's last column block.
    K, N, G = 1024, 8200, 128
    torch.manual_seed(0)
    qw = torch.randint(-2**31, 2**31 - 1, (K, N // 8), dtype=torch.int32, device="cuda")
    qz = torch.randint(-2**31, 2**31 - 1, (K // G, N // 8), dtype=torch.int32, device="cuda")
    sc = torch.randn((K // G, N), device="cuda").half()
    expect = reference.dequantize(qw, qz, sc)
    for rows in (2, 8):
        got = torch.empty((K, N), dtype=torch.float16, device="cuda")
        launch_config(qw, qz, sc, got, "v4", 64, rows)
        torch.cuda.synchronize()
        reference.assert_bitexact(got, expect)
        n += 1
    print(f"sanitize sweep: {n} launches, all bit-exact")
    return 0


if __name__ == "__main__":
    sys.exit(main())
