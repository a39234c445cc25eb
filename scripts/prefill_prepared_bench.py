"""The prepared-layout kernel (prepare_prefill) against linear() and dense, over M.

The seven projections of a Llama-3-8B decoder layer (q, k, v, o, gate, up,
down; random AWQ weights, G = 128, float16) at each M of --rows, each way
captured in a CUDA graph and replayed after an L2 flush (trials x 10 replays
in random order, medians):

- dense: F.linear with the dequantized weights (what nn.Linear runs);
- linear: awq_fast_dequant.linear, tuned per shape and M as a model runs it
  (a fresh autotune cache unless AWQ_FAST_DEQUANT_CACHE_DIR names one);
- prepared: AWQLinear after prepare_prefill, forced onto the prepared-layout
  kernel at every M (the layer itself takes it from 128 rows);
- qkv prepared: q, k and v as one prepared layer (what fuse_projections
  makes of them), in place of the three.

Per M the sum over the projections, in us and against dense; then each
projection at the largest M. Needs compute capability 9.0.

    python scripts/prefill_prepared_bench.py [--rows 64,128,256,512,1024,2048] [--trials 9]
"""

import argparse
import os
import tempfile

import torch
import torch.nn.functional as F

import awq_fast_dequant as awq
from awq_fast_dequant.torch import AWQLinear, prepare_prefill
from prefill_chunks import SHAPES, graph_medians, graph_of

G = 128


def layer_of(K, N, gen, device):
    word = lambda *s: torch.randint(-2**31, 2**31, s, generator=gen).to(torch.int32)  # noqa: E731
    qweight, qzeros = word(K, N // 8), word(K // G, N // 8)
    scales = (torch.rand(K // G, N, generator=gen) * 0.01 + 2.0**-10).half()
    return AWQLinear.from_tensors(qweight.to(device), qzeros.to(device), scales.to(device))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="64,128,256,512,1024,2048", help="values of M")
    ap.add_argument("--trials", type=int, default=9, help="trials (default 9)")
    args = ap.parse_args()
    if not (awq.cuda_available() and torch.cuda.is_available()):
        raise SystemExit("needs a CUDA GPU and awq_fast_dequant built with CUDA")
    device = torch.device("cuda")
    os.environ.setdefault("AWQ_FAST_DEQUANT_CACHE_DIR", tempfile.mkdtemp())
    gen = torch.Generator().manual_seed(0)
    layers = {name: layer_of(K, N, gen, device) for name, K, N in SHAPES}
    qkv = AWQLinear.from_tensors(*(torch.cat([layers[n]._buffers[b] for n in "qkv"], dim=-1)
                                   for b in ("qweight", "qzeros", "scales")))
    prepared = {name: AWQLinear.from_tensors(L.qweight, L.qzeros, L.scales) for name, L in layers.items()}
    prepared["qkv"] = qkv
    for L in prepared.values():
        skipped = prepare_prefill(L, min_rows=1)["skipped"]  # every M on the kernel, to find where it wins
        if skipped:
            raise SystemExit(f"prepare_prefill: {skipped}")
    dense = {name: L.dequantized_weight().contiguous() for name, L in layers.items()}
    names = [name for name, _, _ in SHAPES]
    rows = [int(r) for r in args.rows.split(",")]
    print(f"{torch.cuda.get_device_name(device)}, float16, G = {G}: median us (L2 flushed, CUDA graph, "
          f"{args.trials} x 10)")
    print(f"{'M':>6} {'dense':>9} {'linear':>9} {'prepared':>9} {'qkv prep':>9}   linear/dense  "
          f"prepared/dense  qkv prepared/dense")
    with torch.no_grad():
        for M in rows:
            x = {name: torch.randn(M, K, generator=gen).half().to(device) for name, K, _ in SHAPES}
            ways = {
                "dense": lambda n: F.linear(x[n], dense[n]),
                "linear": lambda n: awq.linear(x[n], layers[n].qweight, layers[n].qzeros, layers[n].scales),
                "prepared": lambda n: prepared[n](x[n]),
            }
            graphs = {(way, n): graph_of([lambda fn=fn, n=n: fn(n)]) for way, fn in ways.items() for n in names}
            graphs[("qkv", "qkv")] = graph_of([lambda: prepared["qkv"](x["q"])])
            med = graph_medians(graphs, args.trials, device)
            total = {way: sum(med[(way, n)] for n in names) for way in ways}
            fused = total["prepared"] - sum(med[("prepared", n)] for n in "qkv") + med[("qkv", "qkv")]
            print(f"{M:6d} {total['dense']:9.2f} {total['linear']:9.2f} {total['prepared']:9.2f} {fused:9.2f}"
                  f"   {total['linear'] / total['dense']:12.3f}  {total['prepared'] / total['dense']:14.3f}"
                  f"  {fused / total['dense']:18.3f}")
        print(f"each projection at M = {M}:")
        print(f"{'':10s}" + "".join(f"{n:>9s}" for n in names) + f"{'qkv':>9s}")
        for way in ways:
            print(f"{way:10s}" + "".join(f"{med[(way, n)]:9.2f}" for n in names)
                  + (f"{med[('qkv', 'qkv')]:9.2f}" if way == "prepared" else ""))


if __name__ == "__main__":
    main()
