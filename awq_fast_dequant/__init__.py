"""awq_fast_dequant: bit-exact, fast AWQ 4-bit dequantization and the fused
W4A16 linear layer.

Turns AWQ "GEMM"-layout packed weights (qweight [K, N/8], qzeros [K/G, N/8],
scales [K/G, N]) back into a dense [K, N] float16 / bfloat16 / float32
matrix, or computes ``x @ W + bias`` straight from them (``linear``), on
NVIDIA GPUs (CUDA kernels compiled ahead of time) and on the CPU.  The dense
weight of the matching nn.Linear is ``out.T``.

Inputs are NumPy arrays or any object with ``__dlpack__`` (torch, CuPy, ...);
the result comes back in the framework of ``qweight``.
"""

from __future__ import annotations


def _import_extension():
    """The compiled extension, or an ImportError that says why it is missing and
    what to do (the bare failure reads like a circular import)."""
    try:
        from . import _C
    except ImportError as exc:
        import glob
        import importlib.machinery
        import os

        here = os.path.dirname(os.path.abspath(__file__))
        built = [p for suffix in importlib.machinery.EXTENSION_SUFFIXES
                 for p in glob.glob(os.path.join(glob.escape(here), "_C" + suffix))]
        if built:
            raise ImportError(
                f"awq_fast_dequant's compiled extension {built[0]} failed to load: {exc}. "
                f"Reinstall the package for this Python and NumPy (from its source folder: "
                f"pip install --force-reinstall --no-build-isolation --no-deps .)"
            ) from exc
        raise ImportError(
            f"awq_fast_dequant's compiled extension (_C) is not in {here}. Python imported "
            f"the package from a source folder, which has no build and shadows the installed "
            f"package (the current folder comes first on sys.path), or the package was never "
            f"built. Install it with `pip install .` and run Python from another folder, or "
            f"build it in place with `python setup.py build_ext --inplace`."
        ) from None
    return _C


_C = _import_extension()

from . import _frameworks
from .quant import pack, quantize, unpack
from . import reference

__version__ = _C.__version__

__all__ = [
    "dequantize",
    "smart_dequantize",
    "linear",
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

_C._set_hooks(_frameworks.allocate, _frameworks.current_stream, _frameworks.matmul,
              _frameworks.time_matmul)

# The hot path is C all the way: no Python frame between the caller and the launch.
dequantize = _C.dequantize
smart_dequantize = _C.smart_dequantize
linear = _C.linear


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
