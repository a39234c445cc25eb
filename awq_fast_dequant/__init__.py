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
from ._frameworks import allocate as _allocate, current_stream as _current_stream
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

_C._set_hooks(_allocate, _current_stream)

# The hot path is C all the way: no Python frame between the caller and the launch.
dequantize = _C.dequantize
smart_dequantize = _C.smart_dequantize


def cuda_available() -> bool:
    """True when the CUDA backend is compiled in and a device is usable."""
    return _C.cuda_available()


def build_info() -> dict:
    """What this build holds: version, compiler, OpenMP, CUDA and its
    architectures, and the generation of each backend's kernels
    (``kernel_generations``), which keys the autotune cache."""
    return _C.build_info()


def cache_path() -> str:
    """Path of the autotune cache file (AWQ_FAST_DEQUANT_CACHE_DIR, else
    $XDG_CACHE_HOME/awq_fast_dequant, else ~/.cache/awq_fast_dequant)."""
    return _C.cache_path()


def cache_entries() -> list:
    """The tuned configurations known to this process (file included).
    Each entry's ``gen`` is the generation of the kernels it was tuned for;
    a build uses only the entries of its own (``build_info()["kernel_generations"]``)
    and keeps the others in the file for the builds that use them."""
    return _C.cache_entries()


def cache_stats() -> dict:
    """Hits, misses and tunings of smart_dequantize in this process."""
    return _C.cache_stats()


def clear_cache() -> None:
    """Forget every tuned configuration, in memory and on disk."""
    _C.clear_cache()
