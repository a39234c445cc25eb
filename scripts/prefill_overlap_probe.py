"""Dequantizing the next projection beside the current one's GEMM, for prefill.

linear()'s dequantize path writes a projection's float16 weights and then
multiplies, one after the other. The weights do not depend on x, so the next
projection's could be written while the current projection's GEMM runs, on a
second stream, if each kept to a share of the multiprocessors: the GEMM is
compute-bound at M = 512 and leaves memory bandwidth free. This probe builds
scripts/prefill_overlap_probe.cu (nvcc, sm_90: an H100 or H200), a dequantize
kernel whose grid of one-block-a-multiprocessor blocks walks the whole weight,
checks that it gives awq_fast_dequant.dequantize's bits, and times the seven
projections of a Llama-3-8B decoder layer (q, k, v, o, gate, up, down; random
AWQ weights, G = 128, float16) at M tokens (default 512), each way captured in
one CUDA graph and replayed after an L2 flush (trials x 10 replays in random
order, medians):

- dense: F.linear with the dequantized weights (what nn.Linear runs);
- dequant+mm: awq_fast_dequant.dequantize into a [K, N] buffer, then torch.mm
  (linear()'s dequantize path);
- mm: the same matmuls on weights dequantized beforehand (the bound);
- mm-cS: those matmuls through cuBLASLt with S multiprocessors carved out
  (torch's experimental SM carveout, which cuBLAS's own path ignores);
- side-T-B: the probe's kernel alone on B blocks, all seven weights, its
  stores T: "st" plain 16-byte stores, "stcs" streaming stores, "bulk" a tile
  at a time through shared memory and the bulk copy engine;
- fill-B: the same grid writing the seven weights' bytes with zeros and
  reading nothing (the stores' ceiling);
- ahead-T-B: each projection's matmul (S = B carved out) with the next
  projection's weights dequantized beside it on B blocks of a second stream;
  the first projection's dequantized by the package beforehand on the main
  stream, or, with "steady", by the last projection's turn (as in a model
  whose previous layer fetched them);
- ahead-T-B-all: the same without the carveout.

Every ahead way is checked to give dequant+mm's bits. Needs torch with CUDA.

    python scripts/prefill_overlap_probe.py [--tokens 512] [--blocks 16,24,32,40] [--trials 9]

The carveout goes through torch._C._set_sm_carveout_experimental and
torch.backends.cuda.preferred_blas_library, both experimental in torch.
"""

import argparse
import contextlib
import ctypes
import pathlib
import subprocess
import tempfile

import torch
import torch.nn.functional as F

import awq_fast_dequant as awq
from prefill_chunks import G, Whole, graph_of, make_layers, time_graphs  # the layer's projections, the timing

THREADS = 1024
# Dynamic shared memory a block, unused: with it no GEMM block fits beside one of
# these. One plain-store block (1,024 threads of 40 registers) fills more than
# half of a multiprocessor's registers; two of the 32-register kernels (streaming
# stores, stores only) could share one, but a grid this small is spread over
# idle multiprocessors first.
SMEM = 100 << 10
MODES = {0: "st", 1: "stcs", 2: "bulk"}  # how the side kernel stores: plain, streaming, bulk copies


def build(out_dir):
    so = pathlib.Path(out_dir) / "prefill_overlap_probe.so"
    src = pathlib.Path(__file__).resolve().with_suffix(".cu")
    subprocess.run(["nvcc", "-O3", "-std=c++17", "-gencode", "arch=compute_90,code=sm_90", "-shared", "-Xcompiler",
                    "-fPIC", str(src), "-o", str(so)], check=True)
    lib = ctypes.CDLL(str(so))
    lib.side_dequant_launch.argtypes = [ctypes.c_int] + [ctypes.c_void_p] * 4 + [ctypes.c_int] * 6 + [ctypes.c_void_p]
    lib.fill_launch.argtypes = [ctypes.c_void_p] + [ctypes.c_int] * 5 + [ctypes.c_void_p]
    return lib


@contextlib.contextmanager
def carveout(sms):
    """torch's matmuls leave sms multiprocessors free (none for 0)."""
    if not sms:
        yield
        return
    before = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library("cublaslt")
    torch._C._set_sm_carveout_experimental(sms)
    try:
        yield
    finally:
        torch._C._set_sm_carveout_experimental(None)
        torch.backends.cuda.preferred_blas_library(before)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=512, help="rows of x (default 512)")
    ap.add_argument("--blocks", default="16,24,32,40", help="multiprocessors for the side kernel (default 16,24,32,40)")
    ap.add_argument("--trials", type=int, default=9, help="trials (default 9)")
    args = ap.parse_args()
    if not (torch.cuda.is_available() and awq.cuda_available()):
        raise SystemExit("needs a CUDA GPU and awq_fast_dequant built with CUDA")
    device = torch.device("cuda")
    if torch.cuda.get_device_capability(device) != (9, 0):
        raise SystemExit("needs compute capability 9.0 (the kernel is built for sm_90)")
    blocks = [int(b) for b in args.blocks.split(",")]
    layers = make_layers(args.tokens, device)
    wholes = [Whole(L) for L in layers]  # linear()'s dequantize path, and its buffers
    for L, whole in zip(layers, wholes):
        L["buf"], L["y"] = whole.w, whole.y
    side = torch.cuda.Stream(device)

    with tempfile.TemporaryDirectory() as tmp:
        lib = build(tmp)

        def side_dequant(L, n, mode, out=None):
            rc = lib.side_dequant_launch(mode, L["qw"].data_ptr(), L["qz"].data_ptr(), L["sc"].data_ptr(),
                                         (L["buf"] if out is None else out).data_ptr(), L["K"], L["N"], G, n,
                                         THREADS, SMEM, torch.cuda.current_stream().cuda_stream)
            if rc:
                raise RuntimeError(f"side_dequant_launch returned {rc}")

        for mode in MODES:
            for L in layers:
                out = torch.full_like(L["buf"], float("nan"))
                side_dequant(L, blocks[0], mode, out)
                if not torch.equal(out, L["dense"].t()):
                    raise SystemExit(f"the side kernel ({MODES[mode]}) differs from awq_fast_dequant.dequantize "
                                     f"on {L['name']}")
        print("the side kernel gives awq_fast_dequant.dequantize's bits on all seven weights, in every mode")

        def dense():
            for L in layers:
                F.linear(L["x"], L["dense"])

        def dequant_mm():
            for whole in wholes:
                whole()

        def mm(sms):
            def run():
                with carveout(sms):
                    for L in layers:
                        torch.mm(L["x"], L["buf"], out=L["y"])
            return run

        def side_all(n, mode):
            def run():
                for L in layers:
                    side_dequant(L, n, mode)
            return run

        scratch = torch.empty(max(L["K"] * L["N"] for L in layers), dtype=torch.float16, device=device)

        def fill_all(n):  # into a buffer of its own: the matmuls' weights keep their values
            def run():
                for L in layers:
                    rc = lib.fill_launch(scratch.data_ptr(), L["K"], L["N"], n, THREADS, SMEM,
                                         torch.cuda.current_stream().cuda_stream)
                    if rc:
                        raise RuntimeError(f"fill_launch returned {rc}")
            return run

        def ahead(n, mode, sms, steady):
            def run():
                main_stream = torch.cuda.current_stream()
                if not steady:
                    L = layers[0]
                    awq.dequantize(L["qw"], L["qz"], L["sc"], out=L["buf"])
                for p, L in enumerate(layers):
                    after = layers[p + 1] if p + 1 < len(layers) else layers[0] if steady else None
                    if after is not None:
                        side.wait_stream(main_stream)  # its buffer's last reader has been issued
                        with torch.cuda.stream(side):
                            side_dequant(after, n, mode)
                    with carveout(sms if after is not None else 0):
                        torch.mm(L["x"], L["buf"], out=L["y"])
                    if after is not None:
                        main_stream.wait_stream(side)
            return run

        ways = {"dense": dense, "dequant+mm": dequant_mm, "mm": mm(0)}
        ways.update({f"mm-c{n}": mm(n) for n in blocks})
        for mode, store in MODES.items():
            ways.update({f"side-{store}-{n}": side_all(n, mode) for n in blocks})
        ways.update({f"fill-{n}": fill_all(n) for n in blocks})
        for mode, store in MODES.items():
            for n in blocks:
                ways[f"ahead-{store}-{n}"] = ahead(n, mode, n, False)
                ways[f"ahead-{store}-{n}-steady"] = ahead(n, mode, n, True)
            ways[f"ahead-{store}-{blocks[-1]}-all"] = ahead(blocks[-1], mode, 0, True)

        dequant_mm()
        reference = [L["y"].clone() for L in layers]
        for way, run in ways.items():
            if way.startswith("ahead"):
                for L in layers:
                    L["y"].fill_(float("nan"))
                run()
                if not all(torch.equal(L["y"], r) for L, r in zip(layers, reference)):
                    raise SystemExit(f"{way} differs from dequant+mm")
        print("every ahead way gives dequant+mm's bits")
        graphs = {(way, "all"): graph_of([run]) for way, run in ways.items()}
        time_graphs(graphs, list(ways), [], args.trials, device,
                    f"seven projections, M = {args.tokens}, float16, G = {G}")


if __name__ == "__main__":
    main()
