"""The C core's development entry points (awq_fast_dequant._C._dev), reached
from this one module so that the rest of the benchmark and the scripts never
name the private namespace.

- launch_config(qweight, qzeros, scales, out, kernel, block_size, rows):
  dequantize into `out` with an explicit kernel, block size and rows per
  thread (rows are internal to the public API).
- empty_launch(device, stream): launch an empty kernel the way dequantize
  launches (set the device, launch on the stream, check the error), with no
  arguments to read: the floor under any launch, for host-overhead figures.
- launch_path(): how kernels are launched, "driver" (cuLaunchKernel),
  "runtime" (cudaLaunchKernel) or "none" (a build without CUDA).
- linear_candidates(x, qweight, qzeros, scales): the fused configurations the
  tuner would try for this problem (dicts: kernel, block_size, rows, split),
  the default first.
- linear_config(x, qweight, qzeros, scales, bias, out, config): the fused
  linear into `out` with one of them.
"""

from .._C import _dev

# The C functions themselves, not wrappers: empty_launch is timed as the host
# floor and launch_config between CUDA events, and a Python frame around either
# would be timed with it.
launch_config = _dev.launch_config
empty_launch = _dev.empty_launch
launch_path = _dev.launch_path
linear_candidates = _dev.linear_candidates
linear_config = _dev.linear_config
