#!/usr/bin/env python3
"""AWQLinear's host time over linear() with its eager call in C
(csrc/module_call.c) and with the same checks in Python, in one process.

The Python call is forced by registering the C call's glue with a tensor type
no x has, so that every call goes back to Python (which adds the declined C
call, a few tens of nanoseconds); the two are alternated round by round, so
that the host's drift cancels. On a GPU the calls are timed while a sleeping
kernel keeps the device busy, so that no call waits on it (DESIGN.md section
6, host overhead). One token through a 4096x4096 layer in float16 on CUDA; on
the host a 128x64 one in float32, whose kernel is short next to the host's
time (G = 128 both).

    python scripts/module_call_ab.py [--device cuda|cpu] [--rounds 40] [--calls 200]
"""
import argparse
import statistics
import time

import torch

import awq_fast_dequant as awq
import awq_fast_dequant.torch._module as module
from awq_fast_dequant.torch import AWQLinear

SLEEP_CYCLES = 200_000_000  # about 0.1 s of GPU time: longer than 1,000 calls


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--calls", type=int, default=200, help="calls per timing (default 200)")
    args = ap.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    dtype = torch.float16 if cuda else torch.float32
    gen = torch.Generator().manual_seed(1)
    K, N = (4096, 4096) if cuda else (128, 64)
    words = lambda *s: torch.randint(-2**31, 2**31, s, generator=gen).to(torch.int32).to(device)
    layer = AWQLinear.from_tensors(words(K, N // 8), words(K // 128, N // 8),
                                   (torch.rand(K // 128, N, generator=gen) * 0.01).to(dtype)
                                   .to(device))
    x = torch.randn(1, K, device=device, dtype=dtype)
    qw, qz, sc = layer.qweight, layer.qzeros, layer.scales
    glue = [torch.nn.Module, module._MODULE_CALL, module._MODULE_CALL_IMPL, module._GLOBAL_HOOKS,
            module._get_tracing_state, torch._C._len_torch_dispatch_stack, module._is_grad_enabled,
            module._FWAD, module._TENSOR, AWQLinear.forward]
    python_only = glue[:8] + [int] + glue[9:]
    cases = {"layer": lambda: layer(x),
             "linear": lambda: awq.linear(x, qw, qz, sc, None, group_size=128)}
    diff = {"C": [], "Python": []}
    try:
        with torch.no_grad():
            for fn in cases.values():
                fn()
            for rnd in range(args.rounds):
                for mode in ("C", "Python") if rnd % 2 else ("Python", "C"):
                    awq._C._set_module_glue(*(glue if mode == "C" else python_only))
                    took = {}
                    for name, fn in cases.items():
                        if cuda:
                            torch.cuda.synchronize(device)
                            torch.cuda._sleep(SLEEP_CYCLES)
                        t0 = time.perf_counter_ns()
                        for _ in range(args.calls):
                            fn()
                        took[name] = (time.perf_counter_ns() - t0) / 1000 / args.calls
                    diff[mode].append(took["layer"] - took["linear"])
            if cuda:
                torch.cuda.synchronize(device)
    finally:
        awq._C._set_module_glue(*glue)
    name = torch.cuda.get_device_name(device) if cuda else "the host"
    print(f"AWQLinear - linear(), us per call, {name}, {args.rounds} rounds of {args.calls} calls:")
    for mode, v in diff.items():
        q = statistics.quantiles(v, n=4)
        print(f"  checks in {mode:6s} median {statistics.median(v):.2f}  "
              f"(quartiles {q[0]:.2f} - {q[2]:.2f})")


if __name__ == "__main__":
    main()
