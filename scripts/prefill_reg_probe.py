"""The prepared-layout kernel at every tile and split, against dense.

Builds scripts/prefill_reg_probe.cu (nvcc, sm_90a: an H100 or H200), which
launches the package's kernel (csrc/cuda/linear_prepared.cuh) with the tile
and split it is given, and loads it with ctypes. The kernel reads W from a
layout prepared once from AWQ's qweight, qzeros and scales (prepare() below,
written apart from the package's): each lane's A fragment of a stage in one
16-byte load. First it checks the kernel against a float64
reference (float16 and bfloat16, rows past a tile, G = 64 and 128, every tile
and split): its error must stay within that of the dense matmul of the
exactly dequantized weights, and two runs must give the same bits. Then it
times the seven projections of a Llama-3-8B decoder layer (q, k, v, o, gate,
up, down; random AWQ weights, G = 128, float16) at M tokens (default 512),
each way captured in a CUDA graph and replayed after an L2 flush (trials x 10
replays in random order, medians):

- dense: F.linear with the dequantized weights (what nn.Linear runs);
- linear: awq_fast_dequant.linear untuned (at these M, dequantize + matmul),
  where the package is built with CUDA;
- rNT/sS: the kernel with NT rows of x a block (256 or 128) and K split over
  S blocks of a cluster; then "best", each projection on its fastest of them,
  and "mix", each on the fastest of them and linear() (what a dispatcher
  would run).

    python scripts/prefill_reg_probe.py [--tokens 512] [--trials 9]
"""

import argparse
import ctypes
import os
import pathlib
import re
import subprocess
import tempfile

os.environ.setdefault("AWQ_FAST_DEQUANT_AUTOTUNE", "0")  # linear(): the untuned default, no tuning run

import torch
import torch.nn.functional as F

import awq_fast_dequant as awq
from prefill_chunks import SHAPES, graph_medians, graph_of
from prefill_smem_probe import agrees, hopper, unpack, weights

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIGS = [(256, 1), (256, 2), (128, 1), (128, 2), (128, 4)]


def build(out_dir):
    so = pathlib.Path(out_dir) / "prefill_reg_probe.so"
    done = subprocess.run(["nvcc", "-O3", "-std=c++17", "-I", str(ROOT / "csrc"), "-gencode",
                           "arch=compute_90a,code=sm_90a", "-shared", "-Xcompiler", "-fPIC",
                           str(ROOT / "scripts" / "prefill_reg_probe.cu"), "-o", str(so)],
                          capture_output=True, text=True)
    print(done.stdout + done.stderr, end="")
    if done.returncode:
        raise SystemExit("nvcc failed")
    if re.search(r"\(C75\d\d\)", done.stdout + done.stderr):
        # ptxas waits for each wgmma before the next: the timings would not be the design's
        raise SystemExit("ptxas serialized the kernel's wgmma (a C75xx message above)")
    lib = ctypes.CDLL(str(so))
    lib.prefill_reg_launch.argtypes = [ctypes.c_int] * 3 + [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4 + \
        [ctypes.c_void_p]
    return lib


def _words(v):
    """int64 values < 2^32 as the int32 words of the same bits."""
    return torch.where(v >= 2**31, v - 2**32, v).to(torch.int32)


def prepare(qw, qz, sc, G):
    """The kernel's layout of AWQ's tensors: (words [N/128, K/64, 2, 4, 32, 4],
    operands [K/G, N/128, 2, 4, 8, 4]), int32.

    Lane (g, i) of warp w in warpgroup h, 128-column tile t, stage s: word kk
    holds, for the columns c = 128 t + 64 h + 16 w + 2 g and c + 1 (A rows g
    and g + 8) and k = 64 s + 16 kk + 2 i (+ 1, + 8, + 9), the nibbles
    [k, c] [k, c+1] [k+8, c] [k+8, c+1] in bits 0-15 and the same of k + 1
    and k + 9 in bits 16-31. Its operands: base + z of c, then for c + 1
    base + z (bfloat16) or -(64 + z) (float16, dequant_pairs' odd form),
    then the two scales, each in both halves of a word."""
    K, N = qw.shape[0], qw.shape[1] * 8
    q = unpack(qw).to(torch.int64)
    # k = 64 s + 16 kk + 8 hi + 2 i + lo, n = 128 t + 64 h + 16 w + 2 g + c
    q = q.view(K // 64, 4, 2, 4, 2, N // 128, 2, 4, 8, 2)
    shift = torch.tensor([[[0, 4], [8, 12]], [[16, 20], [24, 28]]], device=qw.device)  # [lo][hi][c]
    shift = shift.permute(1, 0, 2).reshape(1, 1, 2, 1, 2, 1, 1, 1, 1, 2)  # dims hi, lo, c
    word = (q << shift).sum(dim=(2, 4, 9))  # [s, kk, i, t, h, w, g]
    pw = _words(word.permute(3, 0, 4, 5, 6, 2, 1).contiguous())  # [t, s, h, w, g, i, kk]

    z = unpack(qz).view(K // G, N // 128, 2, 4, 8, 2)
    s16 = sc.view(torch.int16).to(torch.int64).view(K // G, N // 128, 2, 4, 8, 2) & 0xFFFF
    if sc.dtype == torch.float16:
        ze = 0x6400 + z[..., 0].to(torch.int64)
        zo = (-(64 + z[..., 1])).to(torch.float16).view(torch.int16).to(torch.int64) & 0xFFFF
    else:
        ze, zo = 0x4300 + z[..., 0].to(torch.int64), 0x4300 + z[..., 1].to(torch.int64)
    pair = lambda v: v | (v << 16)
    pm = _words(torch.stack([pair(ze), pair(zo), pair(s16[..., 0]), pair(s16[..., 1])], dim=-1).contiguous())
    return pw.reshape(-1, 4), pm.reshape(-1, 4)


def launch(lib, nt, split, x, pw, pm, y, G):
    M, K = x.shape
    rc = lib.prefill_reg_launch(0 if x.dtype == torch.float16 else 1, nt, split, x.data_ptr(), pw.data_ptr(),
                                pm.data_ptr(), y.data_ptr(), M, y.shape[1], K, G,
                                torch.cuda.current_stream().cuda_stream)
    if rc:
        raise RuntimeError(f"prefill_reg_launch returned {rc}")
    return y


def check(lib, device, ahead):
    gen = torch.Generator().manual_seed(1)
    cases = [(512, 1024, 512, 128, torch.float16), (300, 1024, 768, 64, torch.float16),
             (77, 512, 256, 128, torch.bfloat16), (1, 1024, 128, 64, torch.bfloat16)]
    for M, K, N, G, dtype in cases:
        qw, qz, sc, w = weights(K, N, G, dtype, gen, device)
        pw, pm = prepare(qw, qz, sc, G)
        x = torch.randn(M, K, generator=gen).to(dtype).to(device)
        ref = x.double() @ w.double()
        dense = (F.linear(x, w.t()).double() - ref).abs().max().item()
        for nt, split in CONFIGS + [(256, 8)]:
            if (K // 64) % (ahead * split):
                continue
            agrees(lambda y: launch(lib, nt, split, x, pw, pm, y, G), ref, dense, dtype,
                   f"M={M} K={K} N={N} G={G} {str(dtype)[6:]} rows={nt} split={split}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=512, help="rows of x (default 512)")
    ap.add_argument("--trials", type=int, default=9, help="trials (default 9)")
    ap.add_argument("--layers", default="q,k,v,o,gate,up,down", help="projections to time")
    ap.add_argument("--once", metavar="LAYER:ROWS:SPLIT", help="launch the probe twice on one projection and stop "
                    "(for a profiler)")
    args = ap.parse_args()
    ahead = 2  # stages a lane's words are loaded ahead (prep::kAhead): a block's stages, a multiple of it
    device = hopper()
    with tempfile.TemporaryDirectory() as tmp:
        lib = build(tmp)
        if not args.once:
            check(lib, device, ahead)
        gen = torch.Generator().manual_seed(0)
        M, G = args.tokens, 128
        layers = []
        wanted = args.once.split(":")[0] if args.once else args.layers
        for name, K, N in SHAPES:
            if name not in wanted.split(","):
                continue
            qw, qz, sc, w = weights(K, N, G, torch.float16, gen, device)
            pw, pm = prepare(qw, qz, sc, G)
            layers.append({"name": name, "K": K, "qw": qw, "qz": qz, "sc": sc, "pw": pw, "pm": pm,
                           "wt": w.t().contiguous(), "x": torch.randn(M, K, generator=gen).half().to(device),
                           "y": torch.empty(M, N, dtype=torch.float16, device=device)})
        if args.once:
            _, nt, split = args.once.split(":")
            for _ in range(2):
                launch(lib, int(nt), int(split), layers[0]["x"], layers[0]["pw"], layers[0]["pm"], layers[0]["y"], G)
            torch.cuda.synchronize()
            return
        ways = {"dense": lambda L: F.linear(L["x"], L["wt"])}
        if awq.cuda_available():
            ways["linear"] = lambda L: awq.linear(L["x"], L["qw"], L["qz"], L["sc"])
        else:
            print("awq_fast_dequant is built without CUDA: linear() is left out")
        for nt, split in CONFIGS:
            if any((L["K"] // 64) % (ahead * split) for L in layers):
                continue
            ways[f"r{nt}/s{split}"] = lambda L, nt=nt, split=split: launch(lib, nt, split, L["x"], L["pw"], L["pm"],
                                                                           L["y"], G)
        timed = lambda graphs: graph_medians(graphs, args.trials, device)
        graphs = {(way, L["name"]): graph_of([lambda L=L, fn=fn: fn(L)]) for way, fn in ways.items() for L in layers}
        med = timed(graphs)
        names = [L["name"] for L in layers]
        print(f"{torch.cuda.get_device_name(device)}, M = {M}, float16, G = {G}: median us "
              f"(L2 flushed, CUDA graph, {args.trials} x 10), each projection alone")
        print(f"{'':10s}" + "".join(f"{n:>9s}" for n in names) + "      sum  sum / dense")
        base = sum(med[("dense", n)] for n in names)
        for way in ways:
            row = [med[(way, n)] for n in names]
            print(f"{way:10s}" + "".join(f"{m:9.2f}" for m in row) + f"{sum(row):9.2f}  {sum(row) / base:.3f}")
        best = {n: min((w for w in ways if w.startswith("r")), key=lambda w: med[(w, n)]) for n in names}
        print("best: " + ", ".join(f"{n} {best[n]}" for n in names))
        pick = {"best": best}
        if "linear" in ways:  # what a dispatcher would run: the fastest of the probe and linear(), per projection
            pick["mix"] = {n: min((w for w in ways if w != "dense"), key=lambda w: med[(w, n)]) for n in names}
            print("mix: " + ", ".join(f"{n} {pick['mix'][n]}" for n in names))
        whole = timed({k: graph_of([lambda L=L, k=k: ways[pick[k][L["name"]] if k in pick else k](L) for L in layers])
                       for k in [w for w in ("dense", "linear") if w in ways] + list(pick)})
        print("all in one graph: " + ", ".join(f"{k} {v:.2f} ({v / whole['dense']:.3f})" for k, v in whole.items()))


if __name__ == "__main__":
    main()
