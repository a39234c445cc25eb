"""The prepared weight layout of the prefill kernel: built from an AWQLinear's
qweight, qzeros and scales, kept beside them, and used by its forward for
inputs of many rows on compute capability 9.0 (H100, H200).

csrc/cuda/linear_prepared.cuh describes the layout and the kernel; this file
builds the layout with torch on the layer's device and decides when a call
uses it. The layout holds as many bytes as qweight, and four times those of
scales for the zeros and scales: a prepared model keeps its 4-bit weights twice.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

import awq_fast_dequant as _afd
from awq_fast_dequant.reference import REVERSE

__all__ = ["prepare_prefill"]

logger = logging.getLogger("awq_fast_dequant")

# Rows of x from which a prepared layer runs the prefill kernel; below it, linear()
# (whose decode and warpgroup kernels read qweight as it is) is faster: on the seven
# Llama-3-8B projections on an H100 linear() took 0.91x the kernel's time at 128 rows,
# 1.14x at 192 (scripts/prefill_prepared_bench.py).
MIN_ROWS = 192

_linear_prepared = _afd._C._linear_prepared
_capturing = torch.cuda.is_current_stream_capturing
_COLUMN_SHIFTS = tuple(4 * nibble for nibble in REVERSE)
# Bits of nibble [k + 8 hi + lo][c + cc] in a lane's word: lo * 16 + hi * 8 + cc * 4.
_WORD_SHIFTS = ((0, 4), (8, 12)), ((16, 20), (24, 28))  # [lo][hi][cc]
_CHUNK_BYTES = 64 << 20  # int64 codes unpacked at a time


def _codes(words: torch.Tensor) -> torch.Tensor:
    """[R, C] packed int32 words -> [R, 8 C] int64 codes in column order."""
    shifts = torch.tensor(_COLUMN_SHIFTS, dtype=torch.int64, device=words.device)
    return ((words.to(torch.int64).unsqueeze(-1) >> shifts) & 15).reshape(words.shape[0], -1)


def _int32(v: torch.Tensor) -> torch.Tensor:
    """int64 values below 2^32 -> the int32 words of the same bits."""
    return torch.where(v >= 2**31, v - 2**32, v).to(torch.int32)


def layout(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
           group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(words, operands): the prefill kernel's layout of one layer's tensors, on
    their device. words int32 [N/128, K/64, 2, 4, 32, 4], operands int32
    [K/G, N/128, 2, 4, 8, 4] (csrc/cuda/linear_prepared.cuh)."""
    K, N, G = qweight.shape[0], qweight.shape[1] * 8, group_size
    tiles = N // 128
    words = torch.empty((tiles, K // 64, 2, 4, 32, 4), dtype=torch.int32, device=qweight.device)
    shift = torch.tensor(_WORD_SHIFTS, dtype=torch.int64, device=qweight.device)
    shift = shift.permute(1, 0, 2).reshape(1, 1, 2, 1, 2, 1, 1, 1, 1, 2)  # dims hi, lo, cc
    step = max(1, _CHUNK_BYTES // (K * 128 * 8))
    with torch.no_grad():
        for t0 in range(0, tiles, step):
            t1 = min(tiles, t0 + step)
            q = _codes(qweight[:, t0 * 16:t1 * 16])
            # k = 64 s + 16 kk + 8 hi + 2 i + lo, n = 128 t + 64 h + 16 w + 2 g + cc
            q = q.view(K // 64, 4, 2, 4, 2, t1 - t0, 2, 4, 8, 2)
            word = (q << shift).sum(dim=(2, 4, 9))  # [s, kk, i, t, h, w, g]
            words[t0:t1] = _int32(word.permute(3, 0, 4, 5, 6, 2, 1)).reshape(t1 - t0, K // 64, 2, 4, 32, 4)
        z = _codes(qzeros).view(K // G, tiles, 2, 4, 8, 2)
        s16 = scales.view(torch.int16).to(torch.int64).view(K // G, tiles, 2, 4, 8, 2) & 0xFFFF
        if scales.dtype == torch.float16:  # dequant_pairs' forms (csrc/cuda/linear_gemv.cuh)
            even = 0x6400 + z[..., 0]
            odd = (-(64 + z[..., 1])).to(torch.float16).view(torch.int16).to(torch.int64) & 0xFFFF
        else:
            even, odd = 0x4300 + z[..., 0], 0x4300 + z[..., 1]
        pair = lambda v: v | (v << 16)  # noqa: E731
        operands = _int32(torch.stack([pair(even), pair(odd), pair(s16[..., 0]), pair(s16[..., 1])],
                                      dim=-1))
    return words, operands.contiguous()


def unfit_reason(layer: nn.Module) -> str | None:
    """Why the prefill kernel cannot run this layer, or None."""
    b = layer._buffers
    qweight, scales = b.get("qweight"), b.get("scales")
    if qweight is None or scales is None:
        return "its scales are not a buffer"
    if qweight.device.type != "cuda":
        return f"it is on {qweight.device}, not a CUDA device"
    if not _afd._C._prepared_supported(qweight.device.index):
        return (f"{qweight.device} is not compute capability 9.0 (H100, H200), or this build has "
                f"no sm_90a code")
    if scales.dtype not in (torch.float16, torch.bfloat16):
        return f"its dtype is {scales.dtype}, not float16 or bfloat16"
    K, N, G = layer.in_features, layer.out_features, layer.group_size
    if K % 128 or N % 128:
        return f"in_features {K} and out_features {N} are not both multiples of 128"
    if G % 64 or K % G or (G // 64) & (G // 64 - 1):
        return f"group_size {G} is not 64 x 2^j"
    return None


class Prepared:
    """A layer's prepared layout and the tensors it was built from, at their
    versions: a buffer replaced or written in place makes it stale."""

    __slots__ = ("words", "operands", "dtype", "sources", "versions", "min_rows")

    def __init__(self, layer: nn.Module, min_rows: int):
        self.min_rows = min_rows
        b = layer._buffers
        self.sources = (b["qweight"], b["qzeros"], b["scales"])
        self.versions = tuple(_version(t) for t in self.sources)
        self.words, self.operands = layout(*self.sources, layer.group_size)
        self.dtype = self.sources[2].dtype

    def nbytes(self) -> int:
        return self.words.nbytes + self.operands.nbytes

    def fresh(self, b: dict) -> bool:
        qweight, qzeros, scales = self.sources
        return (b.get("qweight") is qweight and b.get("qzeros") is qzeros and b.get("scales") is scales
                and tuple(_version(t) for t in self.sources) == self.versions)


def _version(t: torch.Tensor):
    try:
        return t._version
    except RuntimeError:  # an inference tensor, which has no version counter
        return None


def build(layer: nn.Module, min_rows: int = MIN_ROWS) -> Prepared | None:
    """The layer's layout, or None where the kernel cannot run it."""
    return None if unfit_reason(layer) else Prepared(layer, min_rows)


def forward(layer: nn.Module, x: torch.Tensor, b: dict, bias):
    """y from the prefill kernel, or None where forward must call linear()."""
    pre = layer._prefill
    if (not x.is_cuda or x.dtype is not pre.dtype
            or x.numel() < pre.min_rows * layer.in_features or x.shape[-1] != layer.in_features):
        return None
    if not pre.fresh(b):
        if _capturing():
            return None  # no new memory inside a CUDA graph: linear() this time
        pre = layer._prefill = build(layer, pre.min_rows)
        if pre is None:
            return None
    return _linear_prepared(x, pre.words, pre.operands, bias, layer.group_size, None)


def prepare_prefill(model: nn.Module, enable: bool = True, *, min_rows: int = MIN_ROWS) -> dict:
    """Give every AWQLinear of `model` (or `model` itself) the prefill kernel's
    weight layout, or take it away (enable=False).

    On compute capability 9.0 (H100, H200), float16 or bfloat16, in_features and
    out_features multiples of 128 and group_size 64 x 2^j, a prepared layer runs
    inputs of at least min_rows rows on a kernel that reads its weights
    from the layout straight into the tensor cores' registers: a 512-token
    prefill gets close to the dense layer's speed, where linear() dequantizes
    into a buffer and multiplies (docs/KERNELS.md). The layout costs as much
    GPU memory as qweight again. min_rows sets where the kernel takes over from
    linear(), for each prepared layer. Layers of a fuse_projections group share one
    layout, the group's. Fewer rows, other devices, torch.compile and layers
    that cannot use it run as before.

    The layout follows the layer's buffers: a buffer replaced or written in
    place (load_state_dict, a device or dtype conversion) is prepared again at
    the next call (outside a CUDA graph capture, which gets linear() instead).
    It is never saved: state_dict() holds the checkpoint's tensors only.

    Returns {"prepared": [names], "skipped": {name: reason}, "bytes": n}, the
    bytes of GPU memory the layouts hold."""
    from ._module import AWQLinear  # a cycle at import time otherwise

    if not isinstance(model, nn.Module):
        raise TypeError(f"prepare_prefill takes an nn.Module, got {type(model).__name__}")
    if isinstance(min_rows, bool) or not isinstance(min_rows, int):
        raise TypeError(f"min_rows must be an int, got {type(min_rows).__name__}")
    if min_rows < 1:
        raise ValueError(f"min_rows must be at least 1, got {min_rows}")
    prepared, skipped, total, seen = [], {}, 0, set()
    for name, module in model.named_modules():
        if not isinstance(module, AWQLinear):
            continue
        group = module._siblings
        target = group.fused if group is not None and group.fused is not None else module
        if id(target) in seen:
            prepared.append(name or type(module).__name__)
            continue
        seen.add(id(target))
        if not enable:
            target.__dict__.pop("_prefill", None)
            continue
        reason = unfit_reason(target)
        if reason is not None:
            target.__dict__.pop("_prefill", None)
            skipped[name] = reason
            continue
        target._prefill = Prepared(target, min_rows)
        total += target._prefill.nbytes()
        prepared.append(name or type(module).__name__)
    if enable:
        logger.info("prepare_prefill: %d layers prepared (%.1f MB), %d skipped", len(prepared),
                    total / 1e6, len(skipped))
    return {"prepared": prepared if enable else [], "skipped": skipped, "bytes": total}
