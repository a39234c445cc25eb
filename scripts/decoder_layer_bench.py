"""One Llama-3-8B-shaped decoder layer: AWQLinear against nn.Linear, float16, on the GPU.

transformers' LlamaDecoderLayer with Llama-3-8B's dimensions (hidden 4096,
MLP 14336, 32 query heads and 8 key/value heads of 128) and random weights;
the AWQ layer is the same layer after quantize_model (G = 128); `fused` is the
AWQ layer after fuse_projections too (q/k/v and gate/up each one call). Batch 1.

- decode step: one new token, the whole layer captured in a CUDA graph and
  replayed; attention covers the new token only (no KV cache), so the step is
  the seven projections, two norms and the rotary embedding. Printed: the
  ratio dense / AWQ of the step times (target: >= 2).
- prefill: 512 tokens (--prefill), also replayed from a CUDA graph. Printed:
  the ratio AWQ / dense (target: <= 1.10).
- host overhead: microseconds per call of AWQLinear (a 4096 x 4096 layer, one
  token) against calling awq_fast_dequant.linear directly, the GPU kept busy
  so that no call waits on it (target: within 3 us); nn.Linear of the same
  shape, the registered op that compiled code calls, and nn.Identity (what
  nn.Module's call costs by itself), for comparison.
- on compute capability 9.0 (H100, H200), `AWQ+P` and `fused+P` are the two
  AWQ layers after prepare_prefill: their projections run 128 rows or more on
  the prepared-layout kernel. Printed: their prefill ratio too (eager only:
  under torch.compile the layers go through the registered op, which does not
  use the layout).
- --no-graph: the decode step also run as transformers runs it when nothing
  captures it, launch by launch from Python: --runs steps back to back after
  one L2 flush, timed between CUDA events, so that the host's time counts
  where it exceeds the GPU's (CUDA only).
- --compile: both steps again with each layer under torch.compile (the
  norms, the rotary embedding and the activation fused into a few Triton
  kernels, AWQLinear through its registered op), each captured in a CUDA
  graph the same way.
- --breakdown: every kernel of one replay of each step, with its time, and
  the time in the projections' kernels against the rest (CUDA only).
- --read-floor: a third decode step, the AWQ layer with each projection
  replaced by scripts/read_floor.py's kernel, which only reads the packed
  qweight, and a fixed output: what streaming the weights alone costs in the
  layer, a bound no 4-bit kernel beats by much (CUDA and CuPy).

Every replay is timed alone between CUDA events after an L2 flush; dense and
AWQ alternate in a random order each trial; medians are reported, and the
AWQ layer's output is checked against the dense layer of its own dequantized
weights. --device cpu --tiny runs the same steps on a small layer on the CPU
(no CUDA graphs, no host-overhead figure; the benchmark's CPU timer, a 64 MiB
memset before each step), to check that the script runs.

    python scripts/decoder_layer_bench.py [--trials 15] [--repeats 10] [--prefill 512]
                                          [--compile] [--breakdown] [--read-floor]
                                          [--no-graph [--runs 50]]
"""

import argparse
import copy
import random
import statistics
import time
import warnings

import torch
import transformers

import awq_fast_dequant as awq
from awq_fast_dequant.bench import CpuTimer, CudaTimer
from awq_fast_dequant.torch import AWQLinear, fuse_projections, prepare_prefill, quantize_model

LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                 num_key_value_heads=8, head_dim=128)
TINY = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4,
            num_key_value_heads=2, head_dim=64)
HOST_CALLS = 200        # per sample: well under the launch queue's depth (about a thousand)
HOST_SLEEP_CYCLES = 200_000_000  # torch.cuda._sleep: ~100 ms, far longer than the calls
CPU_FLUSH_BYTES = 64 << 20      # memset before each CPU step, as the benchmark's CPU timer does


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    ap.add_argument("--tiny", action="store_true",
                    help="a small layer instead of Llama-3-8B's (default off)")
    ap.add_argument("--group", type=int, default=128, help="AWQ group size (default 128)")
    ap.add_argument("--prefill", type=int, default=512, help="prefill tokens (default 512)")
    ap.add_argument("--trials", type=int, default=15, help="trials (default 15)")
    ap.add_argument("--repeats", type=int, default=10,
                    help="timed replays per trial and layer (default 10)")
    ap.add_argument("--host-repeats", type=int, default=20,
                    help="host-overhead samples per case (default 20)")
    ap.add_argument("--seed", type=int, default=0, help="weights and inputs (default 0)")
    ap.add_argument("--compile", action="store_true",
                    help="also time both layers under torch.compile (default off)")
    ap.add_argument("--breakdown", action="store_true",
                    help="list the kernels of one replay of each step (CUDA; default off)")
    ap.add_argument("--read-floor", action="store_true",
                    help="also time the decode step with read-only projections (CUDA, "
                         "CuPy; default off)")
    ap.add_argument("--no-graph", action="store_true",
                    help="also time the decode step without a CUDA graph (CUDA; default off)")
    ap.add_argument("--runs", type=int, default=50,
                    help="decode steps back to back per sample with --no-graph (default 50)")
    return ap.parse_args()


def build_layers(dims, group, dtype, device, seed):
    """(dense LlamaDecoderLayer, its AWQ copy, that copy with fuse_projections, the
    two AWQ layers after prepare_prefill by name (none off compute capability 9.0),
    the rotary embedding module)."""
    config = transformers.LlamaConfig(**dims, num_hidden_layers=1, vocab_size=128,
                                      max_position_embeddings=8192)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    dense = transformers.models.llama.modeling_llama.LlamaDecoderLayer(config, layer_idx=0)
    dense = dense.to(device=device, dtype=dtype).eval()
    quantized = copy.deepcopy(dense)
    skipped = quantize_model(quantized, group)
    if skipped:
        raise SystemExit(f"layers left dense: {skipped}")
    rotary = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(config).to(device)
    x = torch.zeros(1, 2, dims["hidden_size"], device=device, dtype=dtype)
    rope = tuple(t.to(dtype) for t in rotary(x, torch.arange(2, device=device).unsqueeze(0)))

    def fused_copy():
        fused = copy.deepcopy(quantized)
        groups = fuse_projections(fused, {"hidden_states": x, "position_embeddings": rope})
        if len(groups) != 2:
            raise SystemExit(f"fuse_projections fused {groups}; expected q/k/v and gate/up")
        return fused

    # on compute capability 9.0 the two AWQ layers again with the prefill layout
    prepared = {"AWQ+P": copy.deepcopy(quantized), "fused+P": fused_copy()}
    for name, layer in prepared.items():
        if prepare_prefill(layer)["skipped"]:
            prepared = {}
            break
    return dense, quantized, fused_copy(), prepared, rotary


def replace_awq_linears(model, make):
    """Every AWQLinear of model replaced, in place, by make(layer, its name); the
    replacements, in the model's order."""
    made = []
    for name, m in list(model.named_modules()):
        if isinstance(m, AWQLinear):
            made.append(make(m, name))
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, made[-1])
    return made


def dense_of(quantized):
    """quantized with each AWQLinear replaced by an nn.Linear of its dequantized weight."""
    def dense(m, _):
        lin = torch.nn.Linear(m.in_features, m.out_features, bias=m.bias is not None,
                              dtype=m.scales.dtype, device=m.scales.device)
        lin.weight.data = m.dequantized_weight()
        return lin

    twin = copy.deepcopy(quantized)
    replace_awq_linears(twin, dense)
    return twin


class ReadOnlyLinear(torch.nn.Module):
    """Stands in for an AWQLinear: reads its packed qweight once with read_floor.py's
    kernel and returns a fixed zero output of one token, so that the projection
    costs what streaming its weights costs and nothing more."""

    def __init__(self, layer, kernel, sink):
        super().__init__()
        import cupy
        self.qweight = layer.qweight
        self.words = cupy.from_dlpack(layer.qweight.detach().view(-1))
        self.kernel, self.sink = kernel, sink
        self.blocks = 8 * torch.cuda.get_device_properties(layer.qweight.device) \
            .multi_processor_count  # read_floor.py's launch
        self.out = torch.zeros(1, 1, layer.out_features, dtype=layer.scales.dtype,
                               device=layer.qweight.device)

    def forward(self, x):
        if x.shape[:-1] != (1, 1):
            raise ValueError("ReadOnlyLinear stands in for one token of one sequence")
        _read_weights(self)
        return self.out


@torch.compiler.disable
def _read_weights(m):
    import cupy
    with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
        m.kernel((m.blocks,), (256,), (m.words, cupy.uint64(m.words.size // 4), m.sink))


def read_only_of(quantized):
    """quantized with each AWQLinear replaced by a ReadOnlyLinear."""
    import cupy
    import read_floor  # beside this script
    kernel = cupy.RawKernel(read_floor.READ_SRC, "read_only")
    sink = cupy.zeros(1, dtype=cupy.uint32)
    twin = copy.deepcopy(quantized)
    replace_awq_linears(twin, lambda m, _: ReadOnlyLinear(m, kernel, sink))
    return twin


class Step:
    """layer(hidden) for fixed inputs of `tokens` tokens; replayed from a CUDA graph on CUDA."""

    def __init__(self, layer, rotary, tokens, hidden, dtype, device, seed):
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(1, tokens, hidden, generator=gen).to(device=device, dtype=dtype)
        positions = torch.arange(tokens, device=device).unsqueeze(0)
        self.rope = tuple(t.to(dtype) for t in rotary(self.x, positions))
        self.layer = layer
        self.graph = None
        if self.x.is_cuda:
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                for _ in range(3):  # warm-up: tuning, allocator, lazy initialization
                    self.eager()
            torch.cuda.current_stream(device).wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.out = self.eager()
        else:
            self.out = self.eager()

    def eager(self):
        with torch.no_grad():
            out = self.layer(self.x, position_embeddings=self.rope)
        return out[0] if isinstance(out, tuple) else out

    def __call__(self):
        if self.graph is None:
            self.out = self.eager()
        else:
            self.graph.replay()
        return self.out


def time_pair(timer, steps, trials, repeats, seed):
    """name -> every timed run (us); the steps in a fresh random order each trial."""
    rng = random.Random(seed)
    samples = {name: [] for name in steps}
    for _ in range(trials):
        order = list(steps)
        rng.shuffle(order)
        for name in order:
            samples[name] += timer.run(steps[name], repeats)[0]
    return samples


def time_without_graph(timer, steps, trials, runs, seed):
    """name -> us per decode step, each sample `runs` steps run back to back from
    Python (no graph) after one L2 flush; the steps in a fresh random order each trial."""
    rng = random.Random(seed)
    samples = {name: [] for name in steps}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(trials):
        order = list(steps)
        rng.shuffle(order)
        for name in order:
            step = steps[name]
            step.eager()  # the same step once more: nothing left to set up
            timer.flush.zero_()
            timer.sync()
            start.record()
            for _ in range(runs):
                step.eager()
            end.record()
            end.synchronize()
            samples[name].append(start.elapsed_time(end) * 1000.0 / runs)
    return samples


def summary(samples):
    med, mean = statistics.median(samples), statistics.fmean(samples)
    flag = "  (median and mean differ by more than 15%)" if abs(mean - med) > 0.15 * med else ""
    return med, f"median {med:9.2f} us, mean {mean:9.2f} us{flag}"


def check(quantized, step_awq, dtype, rotary, tokens, hidden, device, seed):
    """The AWQ layer's output against the dense layer of its own dequantized weights."""
    twin = Step(dense_of(quantized), rotary, tokens, hidden, dtype, device, seed)
    got, want = step_awq().float(), twin().float()
    return ((got - want).abs().max() / want.abs().max()).item()


def kind_of(kernel):
    """'projections' for the linears' kernels (ours, cuBLAS's), 'other' for the rest."""
    name = kernel.lower()
    linear = ("awq", "nvjet", "gemm", "splitkreduce", "read_only")  # ours, cuBLAS's, --read-floor
    return "projections" if any(k in name for k in linear) else "other"


def breakdown(step, timer, label):
    """Print every kernel of one replay of step (L2 flushed first) and the totals."""
    from torch.profiler import ProfilerActivity, profile
    step()
    timer.flush.zero_()
    timer.sync()
    with warnings.catch_warnings():  # the profiler's note on clearing its events
        warnings.simplefilter("ignore", UserWarning)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            timer.sync()
        kernels = sorted((e for e in prof.events()
                          if e.device_type == torch.autograd.DeviceType.CUDA),
                         key=lambda e: e.time_range.start)
    if not kernels:
        print(f"  {label}: the profiler saw no kernels")
        return
    t0 = kernels[0].time_range.start
    totals = {"projections": 0.0, "other": 0.0}
    print(f"  {label}: {len(kernels)} kernels, first start to last end "
          f"{kernels[-1].time_range.end - t0:.1f} us")
    for e in kernels:
        took = e.time_range.end - e.time_range.start
        totals[kind_of(e.name)] += took
        print(f"    {e.time_range.start - t0:8.1f} {took:8.2f}  {e.name[:90]}")
    print(f"    kernel time: projections {totals['projections']:.1f} us, "
          f"other {totals['other']:.1f} us")


def host_overhead(device, repeats):
    """case -> us per call (median), the GPU kept busy: AWQLinear, linear(),
    nn.Linear of the same shape, the registered op (what compiled code calls), and
    nn.Identity (nn.Module's own call, which every module pays); and "difference",
    the median over the rounds of AWQLinear's time less linear()'s in the same
    round (each round times every case once, so the host's drift between rounds
    cancels)."""
    layer = AWQLinear.from_tensors(*_random_layer(4096, 4096, 128, device))
    dense = torch.nn.Linear(4096, 4096, bias=False, device=device, dtype=torch.float16)
    x = torch.randn(1, 4096, device=device, dtype=torch.float16)
    qw, qz, sc = layer.qweight, layer.qzeros, layer.scales
    op = torch.ops.awq_fast_dequant.linear.default
    identity = torch.nn.Identity()  # what nn.Module's call costs by itself on this host
    cases = {"AWQLinear": lambda: layer(x),
             "linear()": lambda: awq.linear(x, qw, qz, sc, None, group_size=128),
             "nn.Linear": lambda: dense(x),
             "op": lambda: op(x, qw, qz, sc, None, 128),
             "nn.Identity": lambda: identity(x)}
    with torch.no_grad():
        for fn in cases.values():
            for _ in range(3):
                fn()
        per_call = {name: [] for name in cases}
        names = list(cases)
        for rep in range(repeats):
            for name in names[rep % len(names):] + names[:rep % len(names)]:
                torch.cuda.synchronize(device)
                torch.cuda._sleep(HOST_SLEEP_CYCLES)
                busy = torch.cuda.Event()
                busy.record()
                t0 = time.perf_counter_ns()
                for _ in range(HOST_CALLS):
                    cases[name]()
                t1 = time.perf_counter_ns()
                if busy.query():
                    raise SystemExit("the GPU went idle while the calls were timed: raise "
                                     "HOST_SLEEP_CYCLES")
                per_call[name].append((t1 - t0) / 1000.0 / HOST_CALLS)
        torch.cuda.synchronize(device)
    medians = {name: statistics.median(v) for name, v in per_call.items()}
    medians["difference"] = statistics.median(
        a - b for a, b in zip(per_call["AWQLinear"], per_call["linear()"]))
    return medians


def _random_layer(K, N, G, device):
    gen = torch.Generator().manual_seed(1)
    words = lambda *s: torch.randint(-2**31, 2**31, s, generator=gen).to(torch.int32)
    scales = (torch.rand(K // G, N, generator=gen) * 0.01).to(torch.float16)
    return (words(K, N // 8).to(device), words(K // G, N // 8).to(device), scales.to(device))


def main():
    args = parse_args()
    device = torch.device(args.device)
    on_cuda = device.type == "cuda"
    if on_cuda and not (awq.cuda_available() and torch.cuda.is_available()):
        raise SystemExit("no usable CUDA device (or awq_fast_dequant was built without CUDA)")
    dims = TINY if args.tiny else LLAMA3_8B
    dtype = torch.float16 if on_cuda else torch.float32
    hidden = dims["hidden_size"]
    dense, quantized, fused, prepared, rotary = build_layers(dims, args.group, dtype, device,
                                                             args.seed)
    if on_cuda:
        timer = CudaTimer(torch, device, max(256 << 20, 2 * torch.cuda.get_device_properties(
            device).L2_cache_size))
        where = torch.cuda.get_device_name(device)
    else:
        timer, where = CpuTimer(CPU_FLUSH_BYTES), "CPU"
    print(f"LlamaDecoderLayer {dims}, G={args.group}, {str(dtype)[6:]}, {where}")

    read_only = None
    if args.read_floor:
        if not on_cuda:
            raise SystemExit("--read-floor needs a CUDA device")
        try:
            import cupy  # noqa: F401
        except ImportError:
            raise SystemExit("--read-floor needs CuPy (the read-only kernel is a CuPy "
                             "RawKernel)") from None
        read_only = read_only_of(quantized)
    if not prepared:
        print("prepare_prefill: not on this device (compute capability 9.0 only)")
    modes = ["eager", "torch.compile"] if args.compile else ["eager"]
    for mode in modes:
        layers = {"dense": dense, "AWQ": quantized, "fused": fused}
        if mode == "eager":
            layers.update(prepared)
        if read_only is not None:
            layers["read-only"] = read_only
        if mode != "eager":
            layers = {name: torch.compile(layer) for name, layer in layers.items()}
        ratios = {}
        for phase, tokens in (("decode step", 1), ("prefill", args.prefill)):
            steps = {name: Step(layer, rotary, tokens, hidden, dtype, device, args.seed)
                     for name, layer in layers.items() if tokens == 1 or name != "read-only"}
            err = max(check(q, steps[name], dtype, rotary, tokens, hidden, device, args.seed)
                      for name, q in (("AWQ", quantized), ("fused", fused), *prepared.items())
                      if name in steps)
            samples = time_pair(timer, steps, args.trials, args.repeats, args.seed)
            medians = {}
            print(f"{phase} ({tokens} token{'s' if tokens > 1 else ''}, {mode}, "
                  f"{'CUDA graph' if on_cuda else 'no graph'}); AWQ output vs its "
                  f"dequantized dense layer: max rel. error {err:.2e}")
            for name, s in samples.items():
                medians[name], text = summary(s)
                print(f"  {name:<6} {text}")
            if args.breakdown and on_cuda:
                for name, st in steps.items():
                    breakdown(st, timer, f"{name}, one replay")
            ratios[phase] = medians
            if args.no_graph and on_cuda and tokens == 1:
                loose = time_without_graph(timer, steps, args.trials, args.runs, args.seed)
                print(f"{phase} without a CUDA graph ({args.runs} steps back to back from "
                      f"Python, per step):")
                for name, s in loose.items():
                    medians[f"{name}, no graph"], text = summary(s)
                    print(f"  {name:<6} {text}")
        decode, prefill = ratios["decode step"], ratios["prefill"]
        prefix = "" if mode == "eager" else f"{mode}: "
        print(f"{prefix}decode step ratio (dense / AWQ): "
              f"{decode['dense'] / decode['AWQ']:.2f}; fused projections "
              f"{decode['dense'] / decode['fused']:.2f}  (target >= 2)")
        if "AWQ, no graph" in decode:
            print(f"{prefix}decode step ratio without a CUDA graph (dense / AWQ): "
                  f"{decode['dense, no graph'] / decode['AWQ, no graph']:.2f}; fused "
                  f"projections {decode['dense, no graph'] / decode['fused, no graph']:.2f}")
        if read_only is not None:
            print(f"{prefix}decode step ratio (dense / read-only): "
                  f"{decode['dense'] / decode['read-only']:.2f}  (weights streamed, nothing "
                  f"computed)")
        print(f"{prefix}prefill ratio (AWQ / dense): "
              f"{prefill['AWQ'] / prefill['dense']:.3f}; fused projections "
              f"{prefill['fused'] / prefill['dense']:.3f}  (target <= 1.10)")
        if "AWQ+P" in prefill:
            print(f"{prefix}prefill ratio with prepare_prefill (AWQ+P / dense): "
                  f"{prefill['AWQ+P'] / prefill['dense']:.3f}; fused projections "
                  f"{prefill['fused+P'] / prefill['dense']:.3f}  (target <= 1.10)")
    if on_cuda:
        host = host_overhead(device, args.host_repeats)
        print(f"host us per call, GPU busy (4096x4096, 1 token): AWQLinear "
              f"{host['AWQLinear']:.2f}, linear() {host['linear()']:.2f}, difference "
              f"{host['difference']:.2f} (median of the rounds' differences; target "
              f"<= 3); nn.Linear "
              f"{host['nn.Linear']:.2f}; torch.ops.awq_fast_dequant.linear {host['op']:.2f}; "
              f"nn.Identity (a module's call alone) {host['nn.Identity']:.2f}")


if __name__ == "__main__":
    main()
