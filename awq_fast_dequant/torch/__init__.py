"""PyTorch integration of awq_fast_dequant (imported only on request; the core package needs no torch).

Importing it registers three torch.library ops, which torch.compile traces
without a graph break and CUDA graphs capture::

    torch.ops.awq_fast_dequant.dequantize(qweight, qzeros, scales, group_size=None, out_dtype=None)
    torch.ops.awq_fast_dequant.dequantize_out(qweight, qzeros, scales, out, group_size=None)
    torch.ops.awq_fast_dequant.linear(x, qweight, qzeros, scales, bias=None, group_size=None)

and provides:

- AWQLinear: an nn.Module with the buffers of AutoAWQ's WQLinear_GEMM
  (qweight, qzeros, scales, bias), whose forward is awq_fast_dequant.linear;
- quantize_model(model, group_size=128, skip=("lm_head",), calibration=None):
  every fitting nn.Linear of a model replaced by an AWQLinear, in place,
  rounded to nearest or, given calibration inputs, with error feedback;
  the fused experts of a mixture-of-experts layer first become an
  UnfusedExperts, one nn.Linear per expert projection;
- fuse_projections(model, example=None): AWQ layers called in a row with one
  input (attention's q/k/v, a gated MLP's gate/up) computed by one call;
  unfuse_projections(model) undoes it;
- prepare_prefill(model): on compute capability 9.0 (H100, H200), a second
  copy of the weights in the layout of the prefill kernel, which then runs
  inputs of 192 rows or more (at the cost of qweight's memory again);
- load_pretrained(path, *, dtype=None, device=None, model_class=None, progress=False,
  revision=None): a Hugging Face AWQ checkpoint, a folder or a Hub repository,
  loaded into its transformers model (needs the 'hf' extra).
"""

import torch as _torch

# DispatchKeySet.raw_repr, which the ops' autograd kernels read, came in torch 2.5.
if tuple(int(p) for p in _torch.__version__.split("+")[0].split(".")[:2]) < (2, 5):
    raise ImportError(f"awq_fast_dequant.torch needs torch >= 2.5; this is torch "
                      f"{_torch.__version__} (pip install 'torch>=2.5')")

from ._ops import dequantize, dequantize_out, linear  # noqa: E402
from ._module import AWQLinear, quantize_model  # noqa: E402
from ._experts import UnfusedExperts  # noqa: E402
from ._siblings import fuse_projections, unfuse_projections  # noqa: E402
from ._prefill import prepare_prefill  # noqa: E402
from ._hf import load_pretrained, parameters_on_meta  # noqa: E402

__all__ = ["AWQLinear", "UnfusedExperts", "quantize_model", "fuse_projections",
           "unfuse_projections", "prepare_prefill", "load_pretrained",
           "parameters_on_meta", "dequantize", "dequantize_out", "linear"]
