"""AWQLinear on the CPU with torch tensors (float32 by default), against
nn.Linear, over the rows M of x: what a model run on the host from PyTorch
sees per layer.

Per layer and M, in the same run (medians of --rounds rounds; each round
times every row once, in turn, after one untimed call):

- dense: nn.Linear with the dequantized weight, torch's own GEMM (for
  bfloat16 on cores with AMX, oneDNN's AMX kernels);
- AWQLinear: its forward (linear() on the autotune cache's path, tuned at
  the first call of each M bucket);
- fused: linear(..., path="fused") (the tuned fused kernel: for bfloat16 on
  cores with AMX, the vector kernel or the AMX one);
- dequant: linear(..., path="dequant"), W dequantized (float32: in slabs of
  at most 16 MiB, each multiplied and added to y before the next; README,
  linear);
- W whole: dequantize into a new [K, N] tensor, then torch.addmm -- the
  dequantize path as it would run without the slabs.

Every row's output is checked against the dense one within linear()'s
tolerance (2^-9 |x| @ |W| + 1 ulp of the dtype, computed in float64).  The figures are
for this machine's cores (torch.get_num_threads() threads for torch, the
package's OpenMP threads for its kernels); a machine shared with other work
gives noisy medians.

    python scripts/cpu_torch_linear.py                    # Llama-3-8B's 4096x4096 and 4096x14336
    python scripts/cpu_torch_linear.py --shapes 384x1536 --m 8,64,256
    python scripts/cpu_torch_linear.py --dtype bfloat16
"""

import argparse
import time

import torch

import awq_fast_dequant as awq
from awq_fast_dequant.torch import AWQLinear

ROWS = ("dense", "AWQLinear", "fused", "dequant", "W whole")


def parse_shapes(text):
    shapes = []
    for item in text.split(","):
        k, n = item.lower().split("x")
        shapes.append((int(k), int(n)))
    return shapes


def layer_pair(K, N, G, seed, dtype):
    """(nn.Linear with the dequantized weight, AWQLinear) of one random layer."""
    torch.manual_seed(seed)
    dense = torch.nn.Linear(K, N).eval()
    q = AWQLinear.from_linear(dense, G).to(dtype).eval()
    dense = dense.to(dtype)
    with torch.no_grad():
        dense.weight.copy_(q.dequantized_weight())
        dense.bias.copy_(q.bias)
    return dense, q


def calls(dense, q, x):
    def whole():
        w = awq.dequantize(q.qweight, q.qzeros, q.scales)
        return torch.addmm(q.bias, x, w)

    args = (x, q.qweight, q.qzeros, q.scales, q.bias)
    return {"dense": lambda: dense(x), "AWQLinear": lambda: q(x),
            "fused": lambda: awq.linear(*args, path="fused"),
            "dequant": lambda: awq.linear(*args, path="dequant"), "W whole": whole}


def check(name, y, x, dense):
    w = dense.weight.double()
    want = x.double() @ w.t() + dense.bias.double()
    bound = 2.0 ** -9 * (x.double().abs() @ w.abs().t()) + torch.finfo(x.dtype).eps * want.abs()
    err = (y.double() - want).abs()
    if not bool((err <= bound).all()):
        raise SystemExit(f"{name}: outside the tolerance (worst excess "
                         f"{float((err - bound).max()):.3g})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="4096x4096,4096x14336",
                    help="comma list of KxN layers (default 4096x4096,4096x14336)")
    ap.add_argument("--m", default="1,16,64,256,1024", help="rows M of x (default 1,16,64,256,1024)")
    ap.add_argument("--group", type=int, default=128, help="group size G (default 128)")
    ap.add_argument("--rounds", type=int, default=7, help="timed rounds (default 7)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                    help="of x, the scales and the bias (default float32)")
    args = ap.parse_args()
    ms = [int(m) for m in args.m.split(",")]
    dtype = getattr(torch, args.dtype)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"awq_fast_dequant {awq.__version__} (AMX: {awq.build_info()['cpu_amx']}); "
          f"{args.dtype}, G = {args.group}, "
          f"medians of {args.rounds} rounds, in ms")
    print(f"{'layer':>11} {'M':>5} " + " ".join(f"{r:>10}" for r in ROWS)
          + f" {'AWQ/dense':>10} {'auto path':>10}")
    for K, N in parse_shapes(args.shapes):
        dense, q = layer_pair(K, N, args.group, K * 31 + N, dtype)
        for M in ms:
            x = torch.randn(M, K).to(dtype)
            with torch.no_grad():
                fns = calls(dense, q, x)
                for name, fn in fns.items():
                    check(name, fn(), x, dense)
                times = {name: [] for name in fns}
                for _ in range(args.rounds):
                    for name, fn in fns.items():
                        t0 = time.perf_counter()
                        fn()
                        times[name].append(time.perf_counter() - t0)
            med = {name: sorted(t)[len(t) // 2] * 1e3 for name, t in times.items()}
            entry = [e for e in awq.cache_entries() if e["op"] == "linear" and e["K"] == K
                     and e["N"] == N and e["G"] == args.group and e["scales_dtype"] == args.dtype
                     and e["M"] == max(1, 1 << (M - 1).bit_length())]
            path = entry[0]["kernel"] if entry else "-"
            print(f"{K:>5}x{N:<5} {M:>5} " + " ".join(f"{med[r]:>10.3f}" for r in ROWS)
                  + f" {med['AWQLinear'] / med['dense']:>10.2f} {path:>10}", flush=True)


if __name__ == "__main__":
    main()
