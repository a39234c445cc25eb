"""linear()'s dequantize path for a prefill, whole and in column chunks.

The seven projections of a Llama-3-8B decoder layer (q, k, v, o, gate, up,
down; random AWQ weights, G = 128, float16) at M tokens (default 512), each
way captured in one CUDA graph and replayed after an L2 flush (15 trials x 10
replays in random order, medians):

- dense: F.linear with the dequantized weights (what nn.Linear runs);
- dequant+mm: dequantize into a [K, N] buffer, then torch.mm: linear()'s
  dequantize path, which writes every float16 weight to memory and reads it
  back;
- chunksC: the same in C column chunks, each dequantized into one small
  reused buffer and multiplied right away, so that the chunk's float16
  weights could stay in L2 between the two kernels.

Checks that the chunks give the bits of the whole. Needs torch with CUDA.

    python scripts/prefill_chunks.py [--tokens 512] [--chunks 2,4,8,16]
"""

import argparse
import random
import statistics

import torch
import torch.nn.functional as F

import awq_fast_dequant as awq
from awq_fast_dequant.bench import CudaTimer

G = 128
SHAPES = [("q", 4096, 4096), ("k", 4096, 1024), ("v", 4096, 1024), ("o", 4096, 4096),
          ("gate", 4096, 14336), ("up", 4096, 14336), ("down", 14336, 4096)]


def make_layers(M, device):
    gen = torch.Generator().manual_seed(0)
    words = lambda *s: torch.randint(-2**31, 2**31, s, generator=gen).to(torch.int32).to(device)
    layers = []
    for name, K, N in SHAPES:
        qw, qz = words(K, N // 8), words(K // G, N // 8)
        sc = (torch.rand(K // G, N, generator=gen) * 0.01).to(torch.float16).to(device)
        layers.append({"name": name, "K": K, "N": N, "qw": qw, "qz": qz, "sc": sc,
                       "dense": awq.dequantize(qw, qz, sc).t().contiguous(),  # [N, K]
                       "x": torch.randn(M, K, device=device, dtype=torch.float16)})
    return layers


class Whole:
    """dequantize into a [K, N] buffer, then one matmul."""

    def __init__(self, L):
        self.L = L
        self.w = torch.empty(L["K"], L["N"], device=L["x"].device, dtype=torch.float16)
        self.y = torch.empty(L["x"].shape[0], L["N"], device=L["x"].device, dtype=torch.float16)

    def __call__(self):
        L = self.L
        awq.dequantize(L["qw"], L["qz"], L["sc"], out=self.w)
        torch.mm(L["x"], self.w, out=self.y)
        return self.y


class Chunks:
    """C column chunks of the packed weights (contiguous copies), each
    dequantized into one shared [K, N / C] buffer and multiplied at once."""

    def __init__(self, L, c):
        self.L, nc = L, L["N"] // c
        w = nc // 8
        self.parts = [(L["qw"][:, i * w:(i + 1) * w].contiguous(), L["qz"][:, i * w:(i + 1) * w].contiguous(),
                       L["sc"][:, i * nc:(i + 1) * nc].contiguous()) for i in range(c)]
        dev = L["x"].device
        self.w = torch.empty(L["K"], nc, device=dev, dtype=torch.float16)
        self.ys = [torch.empty(L["x"].shape[0], nc, device=dev, dtype=torch.float16) for _ in range(c)]

    def __call__(self):
        for (qw, qz, sc), y in zip(self.parts, self.ys):
            awq.dequantize(qw, qz, sc, out=self.w)
            torch.mm(self.L["x"], self.w, out=y)
        return self.ys


def graph_of(fns):
    """One CUDA graph of the calls in fns, after a warm-up outside it."""
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for fn in fns:
            fn()
    return g


def graph_medians(graphs, trials, device):
    """{key: median us} of graphs[key].replay after an L2 flush, trials x 10
    replays, the graphs in random order each trial."""
    timer = CudaTimer(torch, device, 2 * torch.cuda.get_device_properties(device).L2_cache_size + (256 << 20))
    samples = {k: [] for k in graphs}
    keys, rnd = list(graphs), random.Random(0)
    for _ in range(trials):
        rnd.shuffle(keys)
        for k in keys:
            samples[k] += timer.run(graphs[k].replay, 10)[0]
    return {k: statistics.median(v) for k, v in samples.items()}


def time_graphs(graphs, ways, names, trials, device, title):
    """Times graphs[(way, name)] (graph_medians) and prints the medians, a row
    per way, with "all" against dense."""
    med = graph_medians(graphs, trials, device)
    names = names + ["all"]
    print(f"{torch.cuda.get_device_name(device)}, {title}: median us (L2 flushed, CUDA graph, {trials} x 10)")
    print(f"{'':12s}" + "".join(f"{n:>9s}" for n in names) + "  all / dense")
    base = med[("dense", "all")]
    for way in ways:
        row = [med[(way, n)] for n in names]
        print(f"{way:12s}" + "".join(f"{m:9.2f}" for m in row) + f"  {row[-1] / base:.3f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=512, help="rows of x (default 512)")
    ap.add_argument("--chunks", default="2,4,8,16", help="chunk counts (default 2,4,8,16)")
    ap.add_argument("--trials", type=int, default=15, help="trials (default 15)")
    args = ap.parse_args()
    if not (torch.cuda.is_available() and awq.cuda_available()):
        raise SystemExit("needs a CUDA GPU and awq_fast_dequant built with CUDA")
    device = torch.device("cuda")
    layers = make_layers(args.tokens, device)
    counts = [int(c) for c in args.chunks.split(",")]
    for c in counts:
        bad = [L["name"] for L in layers if L["N"] % (8 * c)]
        if bad:
            raise SystemExit(f"{c} chunks do not split N of {', '.join(bad)} into whole words")
    ways = {"dense": [lambda L=L: F.linear(L["x"], L["dense"]) for L in layers],
            "dequant+mm": [Whole(L) for L in layers]}
    for c in counts:
        ways[f"chunks{c}"] = [Chunks(L, c) for L in layers]

    gate = ways["dequant+mm"][4]()
    for c in counts:
        same = torch.equal(torch.cat(ways[f"chunks{c}"][4](), 1), gate)
        if not same:
            raise SystemExit(f"{c} chunks differ from the whole on gate")
    print(f"every chunk count gives the bits of the whole (gate, {args.tokens} tokens)")

    graphs = {}
    for way, fns in ways.items():
        for L, fn in zip(layers, fns):
            graphs[(way, L["name"])] = graph_of([fn])
        graphs[(way, "all")] = graph_of(fns)
    time_graphs(graphs, list(ways), [L["name"] for L in layers], args.trials, device,
                f"M = {args.tokens}, float16, G = {G}")


if __name__ == "__main__":
    main()
