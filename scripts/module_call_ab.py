#!/usr/bin/env python3
"""AWQLinear's host time over linear() with its eager call in C
(csrc/module_call.c) and with the same checks in Python, in one process.

The C call takes x passed by position only; a call with x by keyword
(``layer(x=x)``) is left to the layer's Python call, which makes the same
checks and calls forward (plus the declined C call, a few tens of
nanoseconds). The two are alternated round by round, so that the host's drift
cancels. On a GPU the calls are timed while a sleeping kernel keeps the
device busy, so that no call waits on it (DESIGN.md section 6, host
overhead). One token through a 4096x4096 layer in float16 on CUDA; on the
host a 128x64 one in float32, whose kernel is short next to the host's time
(G = 128 both).

    python scripts/module_call_ab.py [--device cuda|cpu] [--rounds 40] [--calls 200]
"""
import argparse
import statistics
import time

import torch

import awq_fast_dequant as awq
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
    linear = lambda: awq.linear(x, qw, qz, sc, None, group_size=128)
    cases = {"C": (lambda: layer(x), linear), "Python": (lambda: layer(x=x), linear)}
    diff = {"C": [], "Python": []}
    with torch.no_grad():
        for fn in cases["C"] + cases["Python"][:1]:
            fn()
        for rnd in range(args.rounds):
            for mode in ("C", "Python") if rnd % 2 else ("Python", "C"):
                took = []
                for fn in cases[mode]:
                    if cuda:
                        torch.cuda.synchronize(device)
                        torch.cuda._sleep(SLEEP_CYCLES)
                    t0 = time.perf_counter_ns()
                    for _ in range(args.calls):
                        fn()
                    took.append((time.perf_counter_ns() - t0) / 1000 / args.calls)
                diff[mode].append(took[0] - took[1])
        if cuda:
            torch.cuda.synchronize(device)
    name = torch.cuda.get_device_name(device) if cuda else "the host"
    print(f"AWQLinear - linear(), us per call, {name}, {args.rounds} rounds of {args.calls} calls:")
    for mode, v in diff.items():
        q = statistics.quantiles(v, n=4)
        print(f"  checks in {mode:6s} median {statistics.median(v):.2f}  "
              f"(quartiles {q[0]:.2f} - {q[2]:.2f})")


if __name__ == "__main__":
    main()
