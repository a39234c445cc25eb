"""The arithmetic of the linear benchmark (DESIGN.md section 7): the M bucket
the dispatcher tunes per, the bytes and FLOPs of one call, the floor model,
and the figures of one timed row. Pure functions of numbers: nothing here
measures."""

from __future__ import annotations

from .shapes import DTYPE_BYTES, packed_bytes

# Dense peak of the H200 (SXM) in FLOP/s, without sparsity: float16 and
# bfloat16 on tensor cores; float32 on CUDA cores, the unit the float32 fused
# kernel runs on. The floor model's compute term; a figure of the datasheet,
# the one term of the floor model that is not measured in the run.
PEAK_FLOPS = {"float16": 989e12, "bfloat16": 989e12, "float32": 67e12}

# awq_m_bucket in csrc/awq.h: the smallest power of two >= M, every M above
# 4096 in one bucket.
M_BUCKET_MAX = 8192


def m_bucket(M: int) -> int:
    """The M bucket of the autotune cache that a call with M rows of x uses."""
    b = 1
    while b < M and b < M_BUCKET_MAX:
        b <<= 1
    return b


def linear_bytes(M: int, K: int, N: int, G: int, dtype: str) -> int:
    """The floor model's bytes: the quantized layer read once, x read once
    (s*M*K), y written once (s*M*N)."""
    s = DTYPE_BYTES[dtype]
    return packed_bytes(K, N, G, dtype) + s * M * K + s * M * N


def linear_flops(M: int, K: int, N: int) -> int:
    """2*M*K*N: one multiply and one add per weight and row of x."""
    return 2 * M * K * N


def floor_model_us(launch_us: float, copy_gbps: float, nbytes: int, flops: int,
                   peak_flops: float) -> float:
    """launch floor + max(bytes at the copy bandwidth, FLOPs at the peak), in us:
    what a call that launches once and is bound by memory or by arithmetic,
    whichever is slower, would be timed at on this machine."""
    memory_us = nbytes / (copy_gbps * 1e3)
    compute_us = flops / peak_flops * 1e6
    return launch_us + max(memory_us, compute_us)


def _ratio(a, b):
    return a / b if a and b else None


def row_figures(us, *, nbytes: int, flops: int, floor_us=None, dense_us=None,
                packed: int | None = None, copy_rate_gbps=None) -> dict:
    """The figures of one row timed at `us` (its median):

    x_floor = us / floor model; x_dense = dense / us (a speedup); gbps = the
    floor model's bytes / us; tflops = 2MKN / us; packed_gbps = the quantized
    layer's bytes / us and x_copy = packed_gbps / the copy rate (the CPU's
    targets). Missing inputs give None, never an error.
    """
    return {
        "x_floor": _ratio(us, floor_us),
        "x_dense": _ratio(dense_us, us),
        "gbps": nbytes / (us * 1e3) if us else None,
        "tflops": flops / (us * 1e6) if us else None,
        "packed_gbps": packed / (us * 1e3) if us and packed else None,
        "x_copy": _ratio(packed / (us * 1e3) if us and packed else None, copy_rate_gbps),
    }


def crossover(points: list[dict]):
    """The smallest M whose dispatcher choice (auto) is dequantize + matmul, or
    None when auto fuses at every M timed (or nothing was tuned)."""
    picks = [p["M"] for p in points if (p.get("auto_choice") or {}).get("kernel") == "dequant"]
    return min(picks) if picks else None
