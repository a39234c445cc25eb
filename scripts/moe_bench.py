"""One Mixtral-8x7B-shaped mixture-of-experts block: AWQ experts against dense ones, float16.

transformers' MixtralSparseMoeBlock with Mixtral-8x7B's dimensions (hidden
4096, experts' intermediate 14336, 8 experts, 2 per token) and random
weights. The dense block keeps transformers' fused experts (3-D tensors); the
AWQ block is the same block after quantize_model (G = 128), whose experts are
an UnfusedExperts of AWQLinear projections. Both run as transformers runs
them: a loop over the experts that some token picks, which reads on the host
which those are (so no CUDA graph), each forward timed between CUDA events
after an L2 flush. Dense and AWQ alternate in a random order each trial;
medians over trials x repeats are reported for each number of tokens, with
the AWQ block's output checked against the dense block of its own
dequantized weights (the same routing, since the router stays dense). A third
block, "dense unfused", runs those dense weights under UnfusedExperts' own loop
(which reads the routing on the host once per forward, transformers' once per
expert), so that the gain of the 4-bit weights shows apart from the loop's.

    python scripts/moe_bench.py [--tokens 1,16,512] [--trials 9] [--repeats 5]

--device cpu --tiny runs a small block on the CPU (the benchmark's CPU timer)
to check that the script runs.
"""

import argparse
import copy
import random
import statistics

import torch
import transformers

from awq_fast_dequant.bench import CpuTimer, CudaTimer
from awq_fast_dequant.torch import AWQLinear, UnfusedExperts, _experts, quantize_model

MIXTRAL_8X7B = dict(hidden_size=4096, intermediate_size=14336, num_local_experts=8,
                    num_experts_per_tok=2)
TINY = dict(hidden_size=256, intermediate_size=512, num_local_experts=4, num_experts_per_tok=2)
CPU_FLUSH_BYTES = 64 << 20


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    ap.add_argument("--tiny", action="store_true", help="a small block (default off)")
    ap.add_argument("--group", type=int, default=128, help="AWQ group size (default 128)")
    ap.add_argument("--tokens", default="1,16,512",
                    help="comma-separated token counts (default 1,16,512)")
    ap.add_argument("--trials", type=int, default=9, help="trials (default 9)")
    ap.add_argument("--repeats", type=int, default=5,
                    help="timed forwards per trial and block (default 5)")
    ap.add_argument("--seed", type=int, default=0, help="weights and inputs (default 0)")
    return ap.parse_args()


def dense_of(quantized):
    """The block with fused experts (transformers' own module) holding its AWQ experts'
    dequantized weights."""
    twin = copy.deepcopy(quantized)
    experts = twin.experts
    gate, up, down = experts.names
    layers = [experts.expert(e) for e in range(experts.num_experts)]
    with torch.device("meta"):
        fused = transformers.models.mixtral.modeling_mixtral.MixtralExperts(twin.config)
    fused.gate_up_proj = torch.nn.Parameter(torch.stack([
        torch.cat([getattr(m, gate).dequantized_weight(), getattr(m, up).dequantized_weight()])
        for m in layers]))
    fused.down_proj = torch.nn.Parameter(torch.stack(
        [getattr(m, down).dequantized_weight() for m in layers]))
    twin.experts = fused.eval()
    return twin


def main():
    args = parse_args()
    transformers.logging.set_verbosity_error()  # a fused experts module built alone warns
    device = torch.device(args.device)
    dims = TINY if args.tiny else MIXTRAL_8X7B
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    config = transformers.MixtralConfig(**dims, num_hidden_layers=1, vocab_size=128,
                                        num_attention_heads=8, num_key_value_heads=8)
    torch.manual_seed(args.seed)
    block = transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock(config)
    block.config = config
    with torch.no_grad():  # a module built alone is left uninitialized
        for param in block.parameters():
            param.normal_(0, 0.02)
    block = block.to(device=device, dtype=dtype).eval()
    skipped = quantize_model(block, args.group)
    if skipped or not isinstance(block.experts, UnfusedExperts):
        raise SystemExit(f"experts left dense: {skipped}")
    quantized, dense = block, dense_of(block)
    # the dense weights under UnfusedExperts' own loop: what the loop alone changes
    unfused = copy.deepcopy(dense)
    unfused.experts = _experts.unfuse(unfused.experts, quantized.experts.names)
    awq_bytes = sum(b.numel() * b.element_size() for m in quantized.modules()
                    if isinstance(m, AWQLinear) for b in m.buffers() if b is not None)
    dense_bytes = sum(p.numel() * p.element_size() for p in dense.experts.parameters())
    print(f"device: {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, "
          f"torch {torch.__version__}, transformers {transformers.__version__}, {dtype}")
    print(f"block: hidden {dims['hidden_size']}, experts {dims['num_local_experts']} x "
          f"intermediate {dims['intermediate_size']}, {dims['num_experts_per_tok']} per token; "
          f"experts' weights: dense {dense_bytes / 1e9:.3f} GB, AWQ {awq_bytes / 1e9:.3f} GB")
    timer = (CudaTimer(torch, device, 512 << 20) if device.type == "cuda"
             else CpuTimer(CPU_FLUSH_BYTES))
    rng = random.Random(args.seed)
    for tokens in (int(t) for t in args.tokens.split(",")):
        x = torch.randn(1, tokens, dims["hidden_size"], device=device, dtype=dtype,
                        generator=torch.Generator(device).manual_seed(args.seed))
        with torch.no_grad():
            got, want = quantized(x), dense(x)
            err = ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
            assert torch.equal(unfused(x), want)
            blocks = {"dense": dense, "unfused": unfused, "awq": quantized}
            times = {name: [] for name in blocks}
            for _ in range(args.trials):
                order = list(blocks)
                rng.shuffle(order)
                for name in order:
                    samples, _ = timer.run(lambda: blocks[name](x), args.repeats)
                    times[name].extend(samples)
        d, u, a = (statistics.median(times[name]) for name in ("dense", "unfused", "awq"))
        print(f"tokens {tokens}: dense {d:.2f} us, dense unfused {u:.2f} us, AWQ {a:.2f} us, "
              f"dense / AWQ {d / a:.3f}, dense unfused / AWQ {u / a:.3f}; "
              f"max rel. error {err:.2e}")


if __name__ == "__main__":
    main()
