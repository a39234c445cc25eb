"""The torch.library ops: awq_fast_dequant::dequantize, ::dequantize_out and ::linear.

Each op has one CPU/CUDA implementation, which calls the C extension (the
extension reads torch tensors through DLPack, launches on torch's current
stream and allocates with torch's allocator, so the ops need no link against
libtorch and are safe inside CUDA graph capture), and a fake implementation,
which gives torch.compile the output's shape and dtype without running
anything. Backward formulas make ``linear`` and ``dequantize`` differentiable
in the floating-point inputs; the packed integer tensors have no gradient.
"""

from __future__ import annotations

import torch

import awq_fast_dequant as _afd

__all__ = ["dequantize", "dequantize_out", "linear"]


def _groups(qweight: torch.Tensor, scales: torch.Tensor) -> tuple[int, int, int]:
    """(K, G, N) of a layer: G from the rows of scales, which the C core has checked."""
    K, N = qweight.shape[0], scales.shape[1]
    rows = scales.shape[0]
    return K, (K // rows if rows else K), N


def _zero_offsets(qweight: torch.Tensor, qzeros: torch.Tensor, group_size) -> torch.Tensor:
    """q - z for every weight, exactly, as float32 [K, N]: dequantize with unit scales."""
    ones = torch.ones((qzeros.shape[0], 8 * qzeros.shape[1]), dtype=torch.float32,
                      device=qweight.device)
    return dequantize(qweight, qzeros, ones, group_size, torch.float32)


def _group_sums(values: torch.Tensor, K: int, G: int, N: int) -> torch.Tensor:
    """Sum float32 [K, N] over each group of G rows -> [K/G, N]."""
    return values.reshape(K // G, G, N).sum(dim=1) if K else values.new_zeros((0, N))


# --- dequantize -------------------------------------------------------------

@torch.library.custom_op(
    "awq_fast_dequant::dequantize", mutates_args=(), device_types=("cpu", "cuda"),
    schema="(Tensor qweight, Tensor qzeros, Tensor scales, int? group_size=None, "
           "ScalarType? out_dtype=None) -> Tensor")
def dequantize(qweight, qzeros, scales, group_size=None, out_dtype=None):
    """W [K, N] = (q - z) * scale, of out_dtype (default: scales' dtype)."""
    return _afd.dequantize(qweight.contiguous(), qzeros.contiguous(), scales.contiguous(),
                           group_size=group_size, out_dtype=out_dtype)


@dequantize.register_fake
def _(qweight, qzeros, scales, group_size=None, out_dtype=None):
    return scales.new_empty((qweight.shape[0], scales.shape[1]),
                            dtype=scales.dtype if out_dtype is None else out_dtype)


def _dequantize_setup(ctx, inputs, output):
    qweight, qzeros, scales, group_size, _ = inputs
    ctx.group_size = group_size
    ctx.scales_dtype = scales.dtype
    ctx.save_for_backward(qweight, qzeros, scales)


def _dequantize_backward(ctx, grad):
    # d W[k, n] / d scales[k // G, n] = q - z: the gradient of a scale is the
    # sum over its group of grad * (q - z).
    qweight, qzeros, scales = ctx.saved_tensors
    grad_scales = None
    if ctx.needs_input_grad[2]:
        K, G, N = _groups(qweight, scales)
        offsets = _zero_offsets(qweight, qzeros, ctx.group_size)
        grad_scales = _group_sums(grad.float() * offsets, K, G, N).to(ctx.scales_dtype)
    return None, None, grad_scales, None, None


dequantize.register_autograd(_dequantize_backward, setup_context=_dequantize_setup)


# --- dequantize, out= variant -----------------------------------------------

@torch.library.custom_op(
    "awq_fast_dequant::dequantize_out", mutates_args=("out",), device_types=("cpu", "cuda"),
    schema="(Tensor qweight, Tensor qzeros, Tensor scales, Tensor(a!) out, "
           "int? group_size=None) -> ()")
def dequantize_out(qweight, qzeros, scales, out, group_size=None):
    """Writes W into out, of out's dtype ([K, N], contiguous). No autograd."""
    _afd.dequantize(qweight.contiguous(), qzeros.contiguous(), scales.contiguous(),
                    group_size=group_size, out=out, out_dtype=out.dtype)


@dequantize_out.register_fake
def _(qweight, qzeros, scales, out, group_size=None):
    return None


# --- linear -----------------------------------------------------------------

@torch.library.custom_op(
    "awq_fast_dequant::linear", mutates_args=(), device_types=("cpu", "cuda"),
    schema="(Tensor x, Tensor qweight, Tensor qzeros, Tensor scales, Tensor? bias=None, "
           "int? group_size=None) -> Tensor")
def linear(x, qweight, qzeros, scales, bias=None, group_size=None):
    """y [..., N] = x [..., K] @ W + bias, in x's dtype."""
    return _afd.linear(x.contiguous(), qweight.contiguous(), qzeros.contiguous(),
                       scales.contiguous(), None if bias is None else bias.contiguous(),
                       group_size=group_size)


@linear.register_fake
def _(x, qweight, qzeros, scales, bias=None, group_size=None):
    return x.new_empty((*x.shape[:-1], scales.shape[1]))


def _linear_setup(ctx, inputs, output):
    x, qweight, qzeros, scales, bias, group_size = inputs
    ctx.group_size = group_size
    ctx.scales_dtype = scales.dtype
    ctx.save_for_backward(x, qweight, qzeros, scales)


def _linear_backward(ctx, grad):
    x, qweight, qzeros, scales = ctx.saved_tensors
    K, G, N = _groups(qweight, scales)
    grad_x = grad_scales = grad_bias = None
    if ctx.needs_input_grad[0]:
        # y = x @ W  =>  dx = dy @ W^T, with W as the forward pass used it (x's dtype).
        W = dequantize(qweight, qzeros, scales, ctx.group_size, grad.dtype)
        grad_x = grad @ W.t()
    if ctx.needs_input_grad[3]:
        # dW = x^T dy (summed over every leading dimension), then as in dequantize.
        grad_w = x.reshape(-1, K).t().float() @ grad.reshape(-1, N).float()
        offsets = _zero_offsets(qweight, qzeros, ctx.group_size)
        grad_scales = _group_sums(grad_w * offsets, K, G, N).to(ctx.scales_dtype)
    if ctx.needs_input_grad[4]:
        grad_bias = grad.reshape(-1, N).float().sum(dim=0).to(grad.dtype)
    return grad_x, None, None, grad_scales, grad_bias, None


linear.register_autograd(_linear_backward, setup_context=_linear_setup)
