"""The AWQ decoder layer's prefill with its weights dequantized ahead, on a second stream.

linear()'s dequantize path writes each projection's float16 weights right
before its matmul, on the same stream. The weights do not depend on the
layer's input, so they could be written earlier, on a second stream, while
the first runs the norms, the rotary embedding and attention; if those left
memory bandwidth free, the dequantize kernels would cost less than their
137 us at 512 tokens. This script measures it on transformers'
LlamaDecoderLayer with Llama-3-8B's dimensions (the layer of
scripts/decoder_layer_bench.py: random weights, G = 128, float16, batch 1),
each way captured in a CUDA graph and replayed after an L2 flush, medians:

- dense: nn.Linear;
- AWQ: AWQLinear (linear()'s dequantize path);
- ahead: each projection's weights dequantized into a buffer of its own on a
  second stream from the layer's first kernel on, in the order the layer uses
  them, an event after each; the projection waits for its event, then runs
  the same matmul;
- ahead, high priority: the same with the second stream at priority -1
  (torch's high priority), so that its blocks are scheduled before the
  first stream's;
- ahead from o: only o, gate, up and down ahead (q, k and v inline), so
  that the first projections do not wait for the second stream;
- predequantized: every buffer written once before the timing: the layer as
  if dequantizing were free (the bound of any overlap).

Every way's output is checked to equal the AWQ layer's bit for bit (the same
matmuls on the same weights). --breakdown prints the kernels of one replay
of dense, AWQ and ahead. Needs torch with CUDA and transformers.

    python scripts/prefill_ahead.py [--tokens 512] [--trials 9] [--repeats 10] [--breakdown]
"""

import argparse
import copy
import statistics
import sys
from pathlib import Path

import torch

import awq_fast_dequant as awq
from awq_fast_dequant.bench import CudaTimer
from awq_fast_dequant.torch import AWQLinear

sys.path.insert(0, str(Path(__file__).resolve().parent))
import decoder_layer_bench as layer_bench  # noqa: E402  (beside this script)

EVERY = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FROM_O = ("o_proj", "gate_proj", "up_proj", "down_proj")


class BufferedLinear(torch.nn.Module):
    """Stands in for an AWQLinear: y = x @ W + bias with W dequantized into a
    buffer of its own -- inline, or ahead by the layer's Schedule."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer
        self.w = torch.empty(layer.in_features, layer.out_features, dtype=layer.scales.dtype,
                             device=layer.scales.device)
        self.ready = torch.cuda.Event()
        self.ahead = False   # written by the second stream (wait for self.ready)
        self.written = False  # written once for good (predequantized)

    def dequantize(self):
        m = self.layer
        awq.dequantize(m.qweight, m.qzeros, m.scales, group_size=m.group_size, out=self.w)

    def forward(self, x):
        if self.ahead:
            torch.cuda.current_stream().wait_event(self.ready)
        elif not self.written:
            self.dequantize()
        y = x @ self.w
        return y if self.layer.bias is None else y + self.layer.bias


class Schedule:
    """Replaces the AWQLinear of layer by BufferedLinear; the projections in
    `ahead` are dequantized on a second stream when the layer starts, and the
    layer's stream waits for that stream at its end (as a graph capture needs)."""

    def __init__(self, layer, ahead=(), priority=0, predequantized=False):
        self.side = torch.cuda.Stream(priority=priority)
        found = {n.rpartition(".")[2] for n, m in layer.named_modules() if isinstance(m, AWQLinear)}
        if set(ahead) - found:
            raise SystemExit(f"no AWQLinear named {sorted(set(ahead) - found)} in the layer")

        def buffered(m, name):
            b = BufferedLinear(m)
            b.ahead = name.rpartition(".")[2] in ahead
            if predequantized:
                b.dequantize()
                b.written = True
            return b

        self.linears = layer_bench.replace_awq_linears(layer, buffered)
        if any(b.ahead for b in self.linears):
            layer.register_forward_pre_hook(self.start)
            layer.register_forward_hook(self.join)

    def start(self, module, args):
        # The buffers may still be read by the previous call's matmuls.
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            for b in self.linears:
                if b.ahead:
                    b.dequantize()
                    b.ready.record()

    def join(self, module, args, out):
        torch.cuda.current_stream().wait_stream(self.side)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=512, help="prefill tokens (default 512)")
    ap.add_argument("--trials", type=int, default=9, help="trials (default 9)")
    ap.add_argument("--repeats", type=int, default=10,
                    help="timed replays per trial and way (default 10)")
    ap.add_argument("--breakdown", action="store_true",
                    help="the kernels of one replay of dense, AWQ and ahead")
    args = ap.parse_args()
    if not (torch.cuda.is_available() and awq.cuda_available()):
        raise SystemExit("needs a CUDA GPU and awq_fast_dequant built with CUDA")
    device, dtype = torch.device("cuda"), torch.float16
    dims = layer_bench.LLAMA3_8B
    dense, quantized, _, rotary = layer_bench.build_layers(dims, 128, dtype, device, 0)
    layers = {"dense": dense, "AWQ": quantized}
    for name, ahead, priority, pre in (("ahead", EVERY, 0, False),
                                       ("ahead, high priority", EVERY, -1, False),
                                       ("ahead from o", FROM_O, 0, False),
                                       ("predequantized", (), 0, True)):
        layer = copy.deepcopy(quantized)
        Schedule(layer, ahead, priority, pre)
        layers[name] = layer
    hidden = dims["hidden_size"]
    steps = {name: layer_bench.Step(layer, rotary, args.tokens, hidden, dtype, device, 0)
             for name, layer in layers.items()}
    want = steps["AWQ"]().clone()
    for name, step in steps.items():
        if name != "dense" and not torch.equal(step(), want):
            raise SystemExit(f"{name}: the output differs from the AWQ layer's")
    print(f"every AWQ way gives the AWQ layer's bits ({args.tokens} tokens)")
    timer = CudaTimer(torch, device, max(256 << 20, 2 * torch.cuda.get_device_properties(
        device).L2_cache_size))
    samples = layer_bench.time_pair(timer, steps, args.trials, args.repeats, 0)
    print(f"LlamaDecoderLayer {dims}, G=128, float16, {torch.cuda.get_device_name(device)}; "
          f"prefill of {args.tokens} tokens, CUDA graph, L2 flushed, {args.trials} x "
          f"{args.repeats}")
    base = statistics.median(samples["dense"])
    for name, s in samples.items():
        med, text = layer_bench.summary(s)
        print(f"  {name:<21} {text}  / dense {med / base:.3f}")
    if args.breakdown:
        for name in ("dense", "AWQ", "ahead"):
            layer_bench.breakdown(steps[name], timer, f"{name}, one replay")


if __name__ == "__main__":
    main()
