"""A small sweep of the fused CUDA linear, for compute-sanitizer.

    compute-sanitizer --tool memcheck  --error-exitcode 1 python3 scripts/linear_sanitize.py
    compute-sanitizer --tool racecheck --error-exitcode 1 python3 scripts/linear_sanitize.py
    compute-sanitizer --tool synccheck --error-exitcode 1 python3 scripts/linear_sanitize.py
    ... the same with --tune

linear(path="fused") on small shapes that reach every branch of the kernels:
M in {1, 5, 12, 17, 32, 64, 129} (the decode kernel up to M = 32, with one,
two and four n8 tiles of x; one, two and four m16 tiles per warp; the
warpgroup kernel from 33 rows on an H100/H200, two tiles of rows at 129; M
tails), N tails
(a column block of one word column, N = 8), K tails (G = K = 200 and 202),
G in {32, 128, K}, float16 and bfloat16 (the tensor-core kernel), float32 and
misaligned views (the CUDA-core kernel), bias on and off; one call captured
in a CUDA graph and replayed.  On compute capability 9.0 also the prefill
kernel of awq_fast_dequant.torch.prepare_prefill, on shapes that take each of
its tiles of rows (128, 256) and splits of K (1, 2 blocks a cluster, or a
round without and a tail with), with M tails and bias.  Each result is checked against a float64
reference within DESIGN.md section 7's tolerance, and a second call must give
the same bits.

By default every call runs the default configuration (AWQ_FAST_DEQUANT_AUTOTUNE=0).
With --tune the autotuner runs in a fresh cache folder, so that every candidate
configuration of every shape (warps per block, cluster sizes, m16 tiles per
warp, the warpgroup kernel's tiles of rows, the CUDA-core kernel's slices)
is launched under the sanitizer; the
winner's result is checked."""

import argparse
import os
import sys
import tempfile

import numpy as np


def _configure(tune):
    # read once by the extension: set before it is imported
    if tune:
        os.environ["AWQ_FAST_DEQUANT_CACHE_DIR"] = tempfile.mkdtemp(prefix="awq_linear_sanitize_")
        os.environ["AWQ_FAST_DEQUANT_AUTOTUNE"] = "1"
    else:
        os.environ["AWQ_FAST_DEQUANT_AUTOTUNE"] = "0"


MANTISSA = {"float16": (10, -14), "bfloat16": (7, -126), "float32": (23, -126)}


def reference(awq, torch, x, qw, qz, sc, bias, G):
    """(y64, bound): x @ W + bias in float64 with W dequantized in x's dtype, and 2^-9 |x| @ |W|."""
    W = awq.reference.dequantize(qw.cpu().numpy(), qz.cpu().numpy(), sc.float().cpu().numpy(),
                                 group_size=G, out_dtype=str(x.dtype).replace("torch.", ""))
    W = torch.from_numpy(np.asarray(W, dtype=np.float64))
    x64 = x.double().cpu()
    y = x64 @ W
    bound = 2.0**-9 * (x64.abs() @ W.abs())
    if bias is not None:
        y = y + bias.double().cpu()
    return y.numpy(), bound.numpy()


def check(awq, torch, y, x, qw, qz, sc, bias, G, what):
    dtype = str(y.dtype).replace("torch.", "")
    y64, bound = reference(awq, torch, x, qw, qz, sc, bias, G)
    got = y.double().cpu().numpy()
    mant, emin = MANTISSA[dtype]
    ulp = np.exp2(np.floor(np.log2(np.maximum(np.abs(y64), 2.0**emin))) - mant)
    bad = ~(np.abs(got - y64) <= bound + ulp)
    bad &= ~(np.isnan(got) & np.isnan(y64))
    if bad.any():
        m, n = np.argwhere(bad)[0]
        raise AssertionError(f"{what}: {int(bad.sum())} outputs off, first y[{m}, {n}] = {got[m, n]!r}, "
                             f"reference {y64[m, n]!r} +- {bound[m, n] + ulp[m, n]!r}")


def place(torch, t, offset):
    """t on the GPU, as a view `offset` elements into a larger buffer (misaligned when offset > 0)."""
    flat = torch.empty(t.numel() + offset, dtype=t.dtype, device="cuda")
    v = flat[offset:].view(t.shape)
    v.copy_(t)
    return v


def problem(awq, torch, rng, M, K, N, G, dtype, bias, offset=0):
    qw = rng.integers(0, 2**32, (K, N // 8), dtype=np.uint64).astype(np.uint32).view(np.int32)
    qz = rng.integers(0, 2**32, (K // G, N // 8), dtype=np.uint64).astype(np.uint32).view(np.int32)
    sc = np.clip(rng.standard_normal((K // G, N)), -4, 4)
    x = rng.standard_normal((M, K))
    b = rng.standard_normal(N) if bias else None
    dt = getattr(torch, dtype)
    return (place(torch, torch.from_numpy(x).to(dt), offset), torch.from_numpy(qw).cuda(),
            torch.from_numpy(qz).cuda(), place(torch, torch.from_numpy(sc).to(dt), offset),
            None if b is None else place(torch, torch.from_numpy(b).to(dt), offset))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tune", action="store_true", help="tune in a fresh cache folder: every candidate runs")
    ap.add_argument("--quick", action="store_true",
                    help="M in {1, 12, 17, 32, 129}, float16 and float32, four shapes (for the slower checkers)")
    args = ap.parse_args()
    _configure(args.tune)

    import torch
    import awq_fast_dequant as awq

    if not awq.cuda_available():
        print("no CUDA device, or a CPU-only build", file=sys.stderr)
        return 2
    rng = np.random.default_rng(0)
    shapes = [  # K, N, G
        (256, 136, 32),   # N = 136: the last column block holds one word column
        (256, 288, 32),   # the decode kernel (M <= 8): 2 strips and a 4-word tail strip
        (256, 264, 128),
        (200, 72, 200),   # G = K = 200: the last k16 step passes K
        (202, 40, 202),   # K % 4 == 2: half of the last x quad past K
        (96, 8, 32),      # N = 8: one word column
        (384, 520, 384),  # one group, a multiple of 16
        (512, 288, 64),   # K = 512: 8 K slices of 4 steps, so the decode kernel is a candidate at M = 17..32;
                          # the warpgroup kernel's stages (G % 64 == 0), one column block and a 4-word tail
    ]
    ms, dtypes = (1, 5, 12, 17, 32, 64, 129), ("float16", "bfloat16", "float32")
    if args.quick:
        ms, dtypes, shapes = (1, 12, 17, 32, 129), ("float16", "float32"), shapes[:3] + shapes[-1:]
    n = 0
    for M in ms:
        for K, N, G in shapes:
            for dtype in dtypes:
                for bias in (False, True):
                    for offset in ((0, 1) if dtype != "float32" and bias else (0,)):
                        x, qw, qz, sc, b = problem(awq, torch, rng, M, K, N, G, dtype, bias, offset)
                        what = f"M={M} K={K} N={N} G={G} {dtype} bias={bias} offset={offset}"
                        try:
                            y = awq.linear(x, qw, qz, sc, b, group_size=G, path="fused")
                        except Exception as e:
                            raise RuntimeError(f"{what}: {e}") from e
                        torch.cuda.synchronize()
                        check(awq, torch, y, x, qw, qz, sc, b, G, what)
                        again = awq.linear(x, qw, qz, sc, b, group_size=G, path="fused")
                        torch.cuda.synchronize()
                        assert torch.equal(y.view(torch.int16 if dtype != "float32" else torch.int32),
                                           again.view(torch.int16 if dtype != "float32" else torch.int32)), \
                            f"{what}: two calls differ"
                        n += 1
    # one call in a CUDA graph (no tuning while capturing: the default configuration)
    x, qw, qz, sc, b = problem(awq, torch, rng, 5, 256, 136, 32, "float16", True)
    out = torch.empty((5, 136), dtype=torch.float16, device="cuda")
    awq.linear(x, qw, qz, sc, b, group_size=32, out=out, path="fused")  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        awq.linear(x, qw, qz, sc, b, group_size=32, out=out, path="fused")
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    check(awq, torch, out, x, qw, qz, sc, b, 32, "graph replay")
    n += 1
    print(f"{n} fused linear calls checked ({'tuned: every candidate launched' if args.tune else 'defaults'})")
    if torch.cuda.get_device_capability() == (9, 0):
        print(f"{prepared(awq, torch, rng, args.quick)} prepared-layout calls checked")
    return 0


def prepared(awq, torch, rng, quick):
    """The prefill kernel through AWQLinear with a layout (min_rows=1): every call
    of these shapes runs it.  Returns the number of calls checked."""
    from awq_fast_dequant.torch import AWQLinear, prepare_prefill

    shapes = [  # M, K, N, G, bias: the tile and split its cost model picks on 132 or 144 SMs
        (512, 4096, 1024, 128, False),  # 128 rows, K over 2 blocks of a cluster
        (512, 1024, 4096, 64, True),    # 256 rows, no split
        (300, 1024, 768, 64, True),     # a tail of rows
        (1000, 2048, 6144, 128, True),  # a round without a split, the tail over 2 blocks each
        (77, 512, 256, 128, False),     # one partial tile
        (1, 1024, 128, 64, True),       # one row
    ]
    n = 0
    for M, K, N, G, bias in shapes[:3] if quick else shapes:
        for dtype in ("float16",) if quick else ("float16", "bfloat16"):
            x, qw, qz, sc, b = problem(awq, torch, rng, M, K, N, G, dtype, bias)
            layer = AWQLinear.from_tensors(qw, qz, sc, b)
            report = prepare_prefill(layer, min_rows=1)
            assert report["prepared"], f"prepare_prefill left the layer alone: {report['skipped']}"
            what = f"prepared M={M} K={K} N={N} G={G} {dtype} bias={bias}"
            y = layer(x)
            torch.cuda.synchronize()
            check(awq, torch, y, x, qw, qz, sc, b, G, what)
            assert torch.equal(y.view(torch.int16), layer(x).view(torch.int16)), f"{what}: two calls differ"
            n += 1
    return n


if __name__ == "__main__":
    sys.exit(main())
