"""Benchmark of AWQ dequantization: ``python -m awq_fast_dequant bench``.

Method (DESIGN.md section 6, written out in docs/BENCHMARKS.md): per layer
shape, T trials x R timed runs, the implementations in a fresh random order
each trial; on CUDA every timed launch is preceded by an L2 flush and timed
alone between a pair of CUDA events; the result of every trial is compared
bit for bit with the NumPy reference. Reported: median and mean (flagged
when they differ by more than 15%), achieved GB/s of the roofline byte count
and its share of a copy measured in the same run; host microseconds per call
with the GPU kept busy; optionally a block-size sweep (--sweep) and a prefill
layer benchmark (--prefill).

--linear benchmarks linear() instead (DESIGN.md section 7): per layer, dtype
and rows M of x, the fused, auto and dequant+matmul paths and a dense matmul,
each result checked within the tolerance against a float64 reference; times
against the floor model and the dense matmul, the dispatcher's choice per M,
and the verdict of the targets (docs/BENCHMARKS.md, "linear").

Exit status: 0 when everything ran and every one of our implementations
(v1..v4, smart, cpu, and the torch/numpy baselines) was bit-exact on every
trial -- with --linear, every linear path within the tolerance on every
trial, and with --strict every target met; 1 otherwise; 2 for a bad command
line. Peers (vllm, sglang) and the dense baseline are reported, not failed.

Public names, for scripts and tests:

- main(argv=None, prog=...): the command line, returns the exit status.
- register_impl(name, fn, ours=True) / unregister_impl(name): add an
  implementation fn(case) to every later run of this process. The
  environment variable AWQ_FAST_DEQUANT_BENCH_INJECT=name adds one that is
  deliberately one ulp off, held to the contract like ours.
- register_linear_impl(name, fn, ours=True) / unregister_linear_impl(name):
  the same for the rows of --linear, fn(linear case) returning y; there the
  injected one exchanges two output columns.
- PRESETS, Shape, bytes_moved: the layer shapes and their roofline bytes;
  linear_bytes: the bytes of the linear floor model (M rows of x);
  tolerance_check: the tolerance check of a linear result (DESIGN.md section 7).
- make_inputs, Case, cuda_case: the benchmark's data, on a device.
- CudaTimer, cuda_copy_bandwidth: cold-L2 timing between CUDA events, and the
  copy bandwidth measured the same way; CpuTimer: the host clock after a
  memset of a large buffer.
- text_table: the plain-text table of every report.
- launch_config, empty_launch, launch_path, linear_candidates, linear_config:
  the C core's development entry points (an explicit v4 configuration with
  rows per thread; the empty launch under the host-overhead figures; the
  launch path in use; the fused linear's tuning candidates and one of them
  run), see _dev.
"""

from ._dev import empty_launch, launch_config, launch_path, linear_candidates, linear_config
from .cases import Case, cuda_case, make_inputs
from .impls import (register_impl, register_linear_impl, unregister_impl,
                    unregister_linear_impl)
from .linear_check import tolerance_check
from .linear_model import linear_bytes
from .report import table as text_table
from .run import main
from .shapes import PRESETS, Shape, bytes_moved
from .timing import CpuTimer, CudaTimer, cuda_copy_bandwidth

__all__ = [
    "main",
    "register_impl",
    "unregister_impl",
    "register_linear_impl",
    "unregister_linear_impl",
    "PRESETS",
    "Shape",
    "bytes_moved",
    "linear_bytes",
    "tolerance_check",
    "make_inputs",
    "Case",
    "cuda_case",
    "CudaTimer",
    "CpuTimer",
    "cuda_copy_bandwidth",
    "text_table",
    "launch_config",
    "empty_launch",
    "launch_path",
    "linear_candidates",
    "linear_config",
]
