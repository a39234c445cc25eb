"""A fused prefill GEMM that dequantizes W into shared memory, against dense.

Builds scripts/prefill_smem_probe.cu (nvcc, sm_90a: an H100 or H200) and
loads it with ctypes. First it checks the kernel against a float64 reference
(float16 and bfloat16, rows past a tile, G = 64 and 128, with and without a
bias): its error must stay within that of the dense matmul of the exactly
dequantized weights, and two runs must give the same bits. Then it times the
seven projections of a Llama-3-8B decoder layer (q, k, v, o, gate, up, down;
random AWQ weights, G = 128, float16) at M tokens (default 512), each way
captured in one CUDA graph and replayed after an L2 flush (15 trials x 10
replays in random order, medians):

- dense: F.linear with the dequantized weights (what nn.Linear runs);
- linear: awq_fast_dequant.linear untuned (at these M, dequantize + matmul);
- smem128, smem64: the probe with 128 or 64 rows of x a block.

    python scripts/prefill_smem_probe.py [--tokens 512] [--trials 15]
"""

import argparse
import ctypes
import os
import pathlib
import subprocess
import tempfile

os.environ.setdefault("AWQ_FAST_DEQUANT_AUTOTUNE", "0")  # linear(): the untuned default, no tuning run

import torch
import torch.nn.functional as F

import awq_fast_dequant as awq
from prefill_chunks import SHAPES, graph_of, time_graphs  # the layer's projections, the timing

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHIFTS = [0, 16, 4, 20, 8, 24, 12, 28]  # column j of a word: nibble j / 2 + 4 (j % 2), AWQ's order


def build(out_dir):
    so = pathlib.Path(out_dir) / "prefill_smem_probe.so"
    subprocess.run(["nvcc", "-O3", "-std=c++17", "-I", str(ROOT / "csrc"), "-gencode", "arch=compute_90a,code=sm_90a",
                    "-shared", "-Xcompiler", "-fPIC", str(ROOT / "scripts" / "prefill_smem_probe.cu"), "-o", str(so)],
                   check=True)
    lib = ctypes.CDLL(str(so))
    lib.prefill_smem_launch.argtypes = [ctypes.c_int, ctypes.c_int] + [ctypes.c_void_p] * 6 + [ctypes.c_int] * 4 + \
        [ctypes.c_void_p]
    return lib


def unpack(words):
    shifts = torch.tensor(SHIFTS, dtype=torch.int32, device=words.device)
    return ((words.unsqueeze(-1) >> shifts) & 15).reshape(words.shape[0], -1)


def weights(K, N, G, dtype, gen, device):
    word = lambda *s: torch.randint(-2**31, 2**31, s, generator=gen).to(torch.int32).to(device)
    qw, qz = word(K, N // 8), word(K // G, N // 8)
    sc = (torch.rand(K // G, N, generator=gen) * 0.01 + 2.0**-10).to(dtype).to(device)
    # (q - z) is exact in either type, and the product is rounded once, as the package dequantizes
    w = (unpack(qw) - unpack(qz).repeat_interleave(G, 0)).to(dtype) * sc.repeat_interleave(G, 0)
    return qw, qz, sc, w


def launch(lib, bm, x, qw, qz, sc, bias, y, G):
    M, K = x.shape
    rc = lib.prefill_smem_launch(0 if x.dtype == torch.float16 else 1, bm, x.data_ptr(), qw.data_ptr(),
                                 qz.data_ptr(), sc.data_ptr(), None if bias is None else bias.data_ptr(),
                                 y.data_ptr(), M, y.shape[1], K, G, torch.cuda.current_stream().cuda_stream)
    if rc:
        raise RuntimeError(f"prefill_smem_launch returned {rc}")
    return y


def check(lib, device):
    gen = torch.Generator().manual_seed(1)
    cases = [(512, 1024, 512, 128, torch.float16, True), (200, 1024, 768, 64, torch.float16, False),
             (77, 512, 256, 128, torch.bfloat16, True), (1, 256, 256, 64, torch.bfloat16, False)]
    for M, K, N, G, dtype, with_bias in cases:
        qw, qz, sc, w = weights(K, N, G, dtype, gen, device)
        x = torch.randn(M, K, generator=gen).to(dtype).to(device)
        bias = torch.randn(N, generator=gen).to(dtype).to(device) if with_bias else None
        ref = x.double() @ w.double() + (0 if bias is None else bias.double())
        dense = (F.linear(x, w.t(), bias).double() - ref).abs().max().item()
        for bm in (128, 64):
            agrees(lambda y: launch(lib, bm, x, qw, qz, sc, bias, y, G), ref, dense, dtype,
                   f"M={M} K={K} N={N} G={G} {str(dtype)[6:]} bias={with_bias} rows={bm}")


def agrees(run, ref, dense, dtype, label):
    """run(y) into a NaN-filled y and again into a fresh one: its error against
    the float64 ref must stay within twice the dense matmul's (dense), and the
    two runs must give the same bits. Prints the figures; exits otherwise."""
    y = run(torch.full(ref.shape, float("nan"), dtype=dtype, device=ref.device))
    again = run(torch.empty_like(y))
    err = (y.double() - ref).abs().max().item()
    same = torch.equal(y, again)
    print(f"check {label}: max error {err:.3g} (dense {dense:.3g}), deterministic {same}")
    if not (err <= 2 * dense + 1e-6 and same):
        raise SystemExit("the probe disagrees with the reference")


def hopper():
    """The CUDA device, where it is compute capability 9.0 (wgmma, the tensor memory
    accelerator); SystemExit elsewhere."""
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    device = torch.device("cuda")
    if torch.cuda.get_device_capability(device) != (9, 0):
        raise SystemExit("needs compute capability 9.0 (wgmma, the tensor memory accelerator)")
    return device


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=512, help="rows of x (default 512)")
    ap.add_argument("--trials", type=int, default=15, help="trials (default 15)")
    args = ap.parse_args()
    if not awq.cuda_available():
        raise SystemExit("needs awq_fast_dequant built with CUDA")
    device = hopper()
    with tempfile.TemporaryDirectory() as tmp:
        lib = build(tmp)
        check(lib, device)
        gen = torch.Generator().manual_seed(0)
        M, G = args.tokens, 128
        layers = []
        for name, K, N in SHAPES:
            qw, qz, sc, w = weights(K, N, G, torch.float16, gen, device)
            layers.append({"name": name, "qw": qw, "qz": qz, "sc": sc, "wt": w.t().contiguous(),
                           "x": torch.randn(M, K, generator=gen).half().to(device),
                           "y": torch.empty(M, N, dtype=torch.float16, device=device)})
        ways = {"dense": lambda L: F.linear(L["x"], L["wt"]),
                "linear": lambda L: awq.linear(L["x"], L["qw"], L["qz"], L["sc"]),
                "smem128": lambda L: launch(lib, 128, L["x"], L["qw"], L["qz"], L["sc"], None, L["y"], G),
                "smem64": lambda L: launch(lib, 64, L["x"], L["qw"], L["qz"], L["sc"], None, L["y"], G)}
        graphs = {}
        for way, fn in list(ways.items()):
            try:
                for L in layers:
                    graphs[(way, L["name"])] = graph_of([lambda L=L, fn=fn: fn(L)])
                graphs[(way, "all")] = graph_of([lambda L=L, fn=fn: fn(L) for L in layers])
            except RuntimeError as e:  # a way that cannot be captured is left out, not the run
                print(f"{way}: not captured ({e})")
                graphs = {k: v for k, v in graphs.items() if k[0] != way}
                del ways[way]
        time_graphs(graphs, list(ways), [L["name"] for L in layers], args.trials, device,
                    f"M = {M}, float16, G = {G}")


if __name__ == "__main__":
    main()
