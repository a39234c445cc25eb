"""Quantize a realistic layer, dequantize it with awq_fast_dequant, check it bit for bit.

The layer has the shape of Qwen2.5-1.5B's MLP up projection: in_features K = 1536,
out_features N = 8960, group size 128. AWQ stores it as [K, N] (the nn.Linear weight
is the transpose). The weights are random float16.

Dequantization runs on the GPU when the package was built with CUDA and PyTorch sees
a GPU, otherwise on the CPU with NumPy arrays. Either way the result must equal the
pure-NumPy reference bit for bit.

    python examples/basic_usage.py
"""

import os
import statistics
import time

import numpy as np

import awq_fast_dequant as afd
from awq_fast_dequant import reference

K, N, G = 1536, 8960, 128
CALLS = 20  # timed calls; the median is reported


def cuda_torch():
    """torch, if this build has CUDA kernels and torch sees a GPU; else None."""
    if not afd.cuda_available():
        return None
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def time_cpu(args, out):
    afd.dequantize(*args, out=out)  # warm-up
    seconds = []
    for _ in range(CALLS):
        start = time.perf_counter()
        afd.dequantize(*args, out=out)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def time_gpu(torch, args, out):
    for _ in range(3):  # warm-up
        afd.dequantize(*args, out=out)
    torch.cuda.synchronize()
    seconds = []
    for _ in range(CALLS):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()  # on the current stream, which dequantize launches on
        afd.dequantize(*args, out=out)
        end.record()
        end.synchronize()
        seconds.append(start.elapsed_time(end) / 1e3)  # elapsed_time is in ms
    return statistics.median(seconds)


def main():
    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((K, N), dtype=np.float32) * 0.02).astype(np.float16)
    qweight, qzeros, scales = afd.quantize(weight, group_size=G)
    expected = reference.dequantize(qweight, qzeros, scales)

    torch = cuda_torch()
    if torch is not None:
        args = tuple(torch.from_numpy(a).cuda() for a in (qweight, qzeros, scales))
        out = torch.empty((K, N), dtype=torch.float16, device="cuda")
        seconds = time_gpu(torch, args, out)
        device = f"GPU: {torch.cuda.get_device_name()}"
    else:
        args = (qweight, qzeros, scales)
        out = np.empty((K, N), dtype=np.float16)
        seconds = time_cpu(args, out)
        device = f"CPU: {os.cpu_count()} cores"

    # Both the preallocated output and a freshly allocated one must match.
    reference.assert_bitexact(out, expected)
    reference.assert_bitexact(afd.dequantize(*args), expected)

    scale_bytes = out_bytes = 2  # float16
    moved = K * N // 2 + 4 * (K // G) * (N // 8) + scale_bytes * (K // G) * N + out_bytes * K * N
    error = np.abs(expected.astype(np.float32) - weight.astype(np.float32))

    print(f"layer      : K={K} x N={N}, group size {G}, float16")
    print(f"device     : {device}")
    print(f"time       : {seconds * 1e3:.3f} ms per call (median of {CALLS}, out= given)")
    print(f"throughput : {moved / seconds / 1e9:.1f} GB/s ({moved / 1e6:.1f} MB moved per call)")
    print(f"error      : max {error.max():.6f}, mean {error.mean():.6f} (|weight - dequantized|)")
    print("OK: bit-exact against awq_fast_dequant.reference")


if __name__ == "__main__":
    main()
