"""awq_fast_dequant: bit-exact, fast AWQ 4-bit dequantization.

Turns AWQ "GEMM"-layout packed weights (qweight [K, N/8], qzeros [K/G, N/8],
scales [K/G, N]) back into a dense [K, N] float16 / bfloat16 / float32
matrix, on NVIDIA GPUs (CUDA kernels compiled ahead of time) and on the CPU.
The dense weight of the matching nn.Linear is ``out.T``.

Inputs are NumPy arrays or any object with ``__dlpack__`` (torch, CuPy, ...);
the result comes back in the framework of ``qweight``.
"""

from __future__ import annotations

from . import _C
from ._frameworks import allocate as _allocate, default_stream as _default_stream
from .quant import pack, quantize, unpack
from . import reference

__version__ = _C.__version__

__all__ = [
    "dequantize",
    "smart_dequantize",
    "quantize",
    "pack",
    "unpack",
    "reference",
    "cuda_available",
    "build_info",
    "cache_path",
    "cache_entries",
    "cache_stats",
    "clear_cache",
]

_C._set_allocator(_allocate)
_dequantize = _C.dequantize
_smart_dequantize = _C.smart_dequantize


def dequantize(qweight, qzeros, scales, *, group_size=None, out=None, out_dtype=None,
               kernel="auto", block_size=None, stream=None):
    """Dequantize AWQ weights: ``out[k, n] = (q - z) * scale``, rounded once.

    Args:
        qweight: int32/uint32 [K, N/8], eight 4-bit weights per element.
        qzeros: int32/uint32 [K/G, N/8], packed like qweight.
        scales: float16/bfloat16/float32 [K/G, N].
        group_size: G; default K / scales.shape[0]; -1 means G = K.
        out: optional [K, N] destination (same device, the output dtype).
        out_dtype: float16/bfloat16/float32 (name, NumPy or torch dtype);
            default: the dtype of scales.
        kernel: "auto", "v1", "v2", "v3", "v4" (CUDA) or "cpu".
        block_size: threads per block for v3/v4 (a multiple of 32, <= 1024).
        stream: CUDA stream (int handle, torch.cuda.Stream, cupy Stream);
            default: the framework's current stream of the tensors' device.

    Returns:
        ``out`` (or a new [K, N] array in the framework of qweight).
    """
    if stream is None and type(qweight) in _STREAM_HOOKS:
        stream = _STREAM_HOOKS[type(qweight)](qweight)
    return _dequantize(qweight, qzeros, scales, group_size, out, out_dtype, kernel, block_size,
                       stream)


def smart_dequantize(qweight, qzeros, scales, *, group_size=None, out=None, out_dtype=None,
                     stream=None):
    """Like :func:`dequantize`, with the launch tuned once per layer shape.

    The first call for a (device, K, N, G, dtypes) key times every candidate
    configuration and stores the fastest in a C hash table persisted to
    ``cache_path()``; later calls cost one lookup.  Set
    ``AWQ_FAST_DEQUANT_AUTOTUNE=0`` to always use the defaults.
    """
    if stream is None and type(qweight) in _STREAM_HOOKS:
        stream = _STREAM_HOOKS[type(qweight)](qweight)
    return _smart_dequantize(qweight, qzeros, scales, group_size, out, out_dtype, stream)


class _StreamHooks(dict):
    """type -> function giving the framework's current stream, filled lazily.

    Frameworks with the DLPack C exchange API (torch) need no hook: the C
    core asks them directly.  CuPy is asked here."""

    def __missing__(self, tp):
        raise KeyError(tp)

    def __contains__(self, tp):
        if dict.__contains__(self, tp):
            return self[tp] is not None
        hook = _default_stream(tp)
        self[tp] = hook
        return hook is not None


_STREAM_HOOKS = _StreamHooks()


def cuda_available() -> bool:
    """True when the CUDA backend is compiled in and a device is usable."""
    return _C.cuda_available()


def build_info() -> dict:
    """What this build holds: version, compiler, OpenMP, CUDA and its architectures."""
    return _C.build_info()


def cache_path() -> str:
    """Path of the autotune cache file (AWQ_FAST_DEQUANT_CACHE_DIR, else
    $XDG_CACHE_HOME/awq_fast_dequant, else ~/.cache/awq_fast_dequant)."""
    return _C.cache_path()


def cache_entries() -> list:
    """The tuned configurations known to this process (file included)."""
    return _C.cache_entries()


def cache_stats() -> dict:
    """Hits, misses and tunings of smart_dequantize in this process."""
    return _C.cache_stats()


def clear_cache() -> None:
    """Forget every tuned configuration, in memory and on disk."""
    _C.clear_cache()
