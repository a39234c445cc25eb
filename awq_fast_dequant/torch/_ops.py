"""The torch.library ops: awq_fast_dequant::dequantize, ::dequantize_out and ::linear.

Each op has one CPU/CUDA implementation, which calls the C extension (the
extension reads torch tensors through DLPack, launches on torch's current
stream and allocates with torch's allocator, so the ops need no link against
libtorch and are safe inside CUDA graph capture), and a fake implementation,
which gives torch.compile the output's shape and dtype without running
anything. Backward formulas make ``linear`` and ``dequantize`` differentiable
in the floating-point inputs; the packed integer tensors have no gradient.

The ops are defined with torch.library.Library and given their own autograd
kernels rather than through torch.library.custom_op: compiled code calls them
once per layer and step, and custom_op's generic Python wrappers (a pytree walk
for requires_grad, an aliasing check, a dynamo guard) cost about 13 us a call
on top of the 3 us of the call itself on a 2-core VM, and about 22 us on top of
11 us on an H200 machine's host (docs/BENCHMARKS.md). Here a call without gradients is one
Python autograd kernel, which calls the kernel itself when nothing but the
kernel lies below autograd (plain CPU or CUDA tensors, no tracing mode) and
redispatches otherwise. The same autograd kernels give forward-mode AD
(torch.autograd.forward_ad, torch.func.jvp and jacfwd) its tangents.

The fake implementations check what the C core checks, in its order and words,
so that a layer on the meta device, torch.export and torch.compile refuse the
inputs that eager mode refuses instead of tracing them.
"""

from __future__ import annotations

import math
import types

import torch
import torch.autograd.forward_ad as _fwad
from torch import _C
from torch.utils.flop_counter import register_flop_formula

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
    return _DEQUANTIZE(qweight, qzeros, ones, group_size, torch.float32)


def _group_sums(values: torch.Tensor, K: int, G: int, N: int) -> torch.Tensor:
    """Sum float32 [K, N] over each group of G rows -> [K/G, N]."""
    return values.reshape(K // G, G, N).sum(dim=1) if K else values.new_zeros((0, N))


# --- forward-mode AD ----------------------------------------------------------
#
# A tangent lives on a tensor only inside a dual level (forward_ad.dual_level, which
# torch.func.jvp enters too), and forward_ad keeps the current level in a module
# global, -1 outside any: the autograd kernels test ``FWAD._current_level >= 0``,
# one attribute read, before they look for tangents. A torch whose forward_ad has
# no such global counts as always inside a level: every call then looks for
# tangents, slower but never wrong.
FWAD = _fwad if isinstance(getattr(_fwad, "_current_level", None), int) else \
    types.SimpleNamespace(_current_level=0)

def _unpack(t):
    """(primal, tangent) of t at the current dual level; (t, None) for None or no tangent."""
    if t is None:
        return None, None
    primal, tangent = _fwad.unpack_dual(t)
    return (t, None) if tangent is None else (primal, tangent)


# --- what the fake implementations check ---------------------------------------
#
# The C core's checks (csrc/views.c, csrc/validate.c) on shapes, dtypes and
# devices, with its exception types and messages; memory layout is the real
# kernels' business (they make their inputs contiguous). Shapes may be symbolic:
# a comparison then guards on the traced shapes, as torch's own meta kernels do.

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
_PACKED = (torch.int32, torch.uint32)
_FLOAT_NAMES = "float16, bfloat16 or float32"


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _check_ndim(t, name: str, lo: int, hi: int) -> None:
    n = t.dim()
    if lo <= n <= hi:
        return
    dims = f"{n} dimension{'' if n == 1 else 's'}"
    if lo == hi:
        raise ValueError(f"{name} must be a {lo}-D array, got {dims}")
    raise ValueError(f"{name} must have {lo} to {hi} dimensions, got {dims}")


def _check_packed(t, name: str) -> None:
    if t.dtype not in _PACKED:
        raise TypeError(f"{name} must be int32 or uint32 (8 packed 4-bit values per element), "
                        f"got {_name(t.dtype)}")


def _check_devices(named) -> None:
    (first_name, first), *rest = [(n, t) for n, t in named if t is not None]
    for name, t in rest:
        if t.device != first.device:
            raise ValueError(f"all tensors must be on one device: {first_name} is on "
                             f"{first.device} but {name} is on {t.device}")


def _check_weights(qweight, qzeros, scales, group_size) -> None:
    """qweight [K, N/8], qzeros [K/G, N/8], scales [K/G, N], G from group_size or the rows."""
    K, W = qweight.shape
    N, rows = 8 * W, scales.shape[0]
    if qzeros.shape[1] != W:
        raise ValueError(f"qzeros must have {W} columns like qweight (N/8 packed words), got "
                         f"{qzeros.shape[1]}")
    if scales.shape[1] != N:
        raise ValueError(f"scales must have {N} columns (8 x qweight's {W} packed columns), got "
                         f"{scales.shape[1]}")
    if qzeros.shape[0] != rows:
        raise ValueError(f"qzeros and scales must have the same number of rows (K/group_size), "
                         f"got qzeros {qzeros.shape[0]} and scales {rows}")
    if group_size is not None:
        g = (K if K > 0 else 1) if group_size == -1 else group_size
        if g <= 0:
            raise ValueError(f"group_size must be positive (or -1 for G = K), got {g}")
        if K % g:
            raise ValueError(f"group_size {g} does not divide K = {K} (qweight rows)")
        if K // g != rows:
            raise ValueError(f"group_size {g} gives K/group_size = {K // g} groups, but scales "
                             f"and qzeros have {rows} rows")
    elif rows == 0:
        if K != 0:
            raise ValueError(f"scales and qzeros have 0 rows but qweight has K = {K} rows")
    elif K % rows:
        raise ValueError(f"scales and qzeros have {rows} rows, which does not divide K = {K}; "
                         f"each must have K/group_size rows")
    elif K < rows:
        raise ValueError(f"scales and qzeros have {rows} rows, more than K = {K}")


def _check_dequantize(qweight, qzeros, scales, group_size, out_dtype, out=None) -> None:
    for t, name in ((qweight, "qweight"), (qzeros, "qzeros"), (scales, "scales"), (out, "out")):
        if t is not None:
            _check_ndim(t, name, 2, 2)
    _check_packed(qweight, "qweight")
    _check_packed(qzeros, "qzeros")
    if scales.dtype not in _FLOATS:
        raise TypeError(f"scales must be {_FLOAT_NAMES}, got {_name(scales.dtype)}")
    if out_dtype is not None and out_dtype not in _FLOATS:
        raise TypeError(f"out_dtype must be {_FLOAT_NAMES} (a name, NumPy or torch dtype), got "
                        f"{out_dtype}")
    _check_devices((("qweight", qweight), ("qzeros", qzeros), ("scales", scales), ("out", out)))
    _check_weights(qweight, qzeros, scales, group_size)
    if out is not None and tuple(out.shape) != (qweight.shape[0], scales.shape[1]):
        raise ValueError(f"out must have shape ({qweight.shape[0]}, {scales.shape[1]}), got "
                         f"({out.shape[0]}, {out.shape[1]})")
    if out is not None and not out.is_contiguous():
        raise ValueError("out is not C-contiguous; pass out.contiguous() (torch/CuPy) or "
                         "numpy.ascontiguousarray(out)")


def _check_linear(x, qweight, qzeros, scales, bias, group_size) -> None:
    named = (("x", x), ("qweight", qweight), ("qzeros", qzeros), ("scales", scales),
             ("bias", bias))
    _check_ndim(x, "x", 1, 8)
    for name, t in named[1:4]:
        _check_ndim(t, name, 2, 2)
    if bias is not None:
        _check_ndim(bias, "bias", 1, 1)
    if x.dtype not in _FLOATS:
        raise TypeError(f"x must be {_FLOAT_NAMES}, got {_name(x.dtype)}")
    _check_packed(qweight, "qweight")
    _check_packed(qzeros, "qzeros")
    for name, t in named[3:]:
        if t is not None and t.dtype != x.dtype:
            raise TypeError(f"{name} must have x's dtype {_name(x.dtype)}, got {_name(t.dtype)}")
    _check_devices(named)
    _check_weights(qweight, qzeros, scales, group_size)
    K, N = qweight.shape[0], scales.shape[1]
    if x.shape[-1] != K:
        raise ValueError(f"x's last dimension must be K = {K} (qweight's rows, in_features), "
                         f"got {x.shape[-1]}")
    if bias is not None and bias.shape[0] != N:
        raise ValueError(f"bias must have shape ({N},) (N, out_features), got ({bias.shape[0]},)")


# --- definitions -----------------------------------------------------------

_lib = torch.library.Library("awq_fast_dequant", "DEF")
_lib.define("dequantize(Tensor qweight, Tensor qzeros, Tensor scales, int? group_size=None, "
            "ScalarType? out_dtype=None) -> Tensor")
_lib.define("dequantize_out(Tensor qweight, Tensor qzeros, Tensor scales, Tensor(a!) out, "
            "int? group_size=None) -> ()")
_lib.define("linear(Tensor x, Tensor qweight, Tensor qzeros, Tensor scales, Tensor? bias=None, "
            "int? group_size=None) -> Tensor")

_DEQUANTIZE = torch.ops.awq_fast_dequant.dequantize.default
_DEQUANTIZE_OUT = torch.ops.awq_fast_dequant.dequantize_out.default
_LINEAR = torch.ops.awq_fast_dequant.linear.default
# The public names; the code below uses the constants, which nothing rebinds.
dequantize, dequantize_out, linear = _DEQUANTIZE, _DEQUANTIZE_OUT, _LINEAR


def _register(name: str, kernel, fake, autograd) -> None:
    for key in ("CPU", "CUDA"):
        _lib.impl(name, kernel, key)
    torch.library.register_fake(f"awq_fast_dequant::{name}", fake, lib=_lib)
    _lib.impl(name, autograd, "Autograd", with_keyset=True)


def _below_autograd(op, keyset, *args):
    """op on args with the autograd keys skipped (the kernel, or the tracing modes under it)."""
    with _C._AutoDispatchBelowAutograd():
        return op.redispatch(keyset & _C._after_autograd_keyset, *args)


# The dispatch key set of a call on plain CPU or CUDA tensors with no mode active:
# the backend and its autograd key (ADInplaceOrView, a fallthrough for ops that
# neither view nor mutate, is normally left out; a set that has it means the same).
# Below autograd there is then only the kernel, which _without_grad calls itself.
# Any other set -- a fake or functional tensor, a dispatch mode, mixed devices --
# goes through the dispatcher.
_PLAIN = frozenset(
    keys.raw_repr()
    for backend, autograd in ((_C.DispatchKey.CPU, _C.DispatchKey.AutogradCPU),
                              (_C.DispatchKey.CUDA, _C.DispatchKey.AutogradCUDA))
    for keys in (_C.DispatchKeySet(backend).add(autograd),
                 _C.DispatchKeySet(backend).add(autograd).add(_C.DispatchKey.ADInplaceOrView)))


def _without_grad(op, kernel, keyset, *args):
    """op on args when no gradient is needed: the kernel itself if nothing else lies
    below autograd, else the dispatcher below autograd."""
    if keyset.raw_repr() in _PLAIN:
        return kernel(*args)
    return _below_autograd(op, keyset, *args)


# --- dequantize -------------------------------------------------------------

# A torch without the DLPack exchange API (2.9 has none) hands tensors to the C
# extension through Tensor.__dlpack__, which refuses one that requires grad (and,
# with a RuntimeError, one that torch.func wraps); below autograd the kernels'
# inputs may require grad (their autograd kernel has recorded it already).
OLD_DLPACK = not hasattr(torch.Tensor, "__dlpack_c_exchange_api__")
if OLD_DLPACK:
    def _bare(t: torch.Tensor) -> torch.Tensor:
        return t.detach().contiguous()
else:
    _bare = torch.Tensor.contiguous  # the method itself: no Python frame a tensor


def _dequantize_kernel(qweight, qzeros, scales, group_size=None, out_dtype=None):
    """W [K, N] = (q - z) * scale, of out_dtype (default: scales' dtype)."""
    return _afd.dequantize(_bare(qweight), _bare(qzeros), _bare(scales),
                           group_size=group_size, out_dtype=out_dtype)


def _dequantize_fake(qweight, qzeros, scales, group_size=None, out_dtype=None):
    _check_dequantize(qweight, qzeros, scales, group_size, out_dtype)
    return scales.new_empty((qweight.shape[0], scales.shape[1]),
                            dtype=scales.dtype if out_dtype is None else out_dtype)


def _no_autocast(grad: torch.Tensor):
    """A backward formula's products in the dtypes it names, also when backward runs
    under torch.autocast (backward() called inside it, or a compiled graph traced
    there): the layer's forward ignores autocast, and so its gradients do."""
    return torch.autocast(grad.device.type, enabled=False)


class _Dequantize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, keyset, qweight, qzeros, scales, group_size, out_dtype):
        ctx.group_size = group_size
        ctx.scales_dtype = scales.dtype
        ctx.save_for_backward(qweight, qzeros, scales)
        return _below_autograd(_DEQUANTIZE, keyset, qweight, qzeros, scales, group_size,
                               out_dtype)

    @staticmethod
    def backward(ctx, grad):
        # d W[k, n] / d scales[k // G, n] = q - z: the gradient of a scale is the
        # sum over its group of grad * (q - z).
        qweight, qzeros, scales = ctx.saved_tensors
        grad_scales = None
        if ctx.needs_input_grad[3]:
            with _no_autocast(grad):
                K, G, N = _groups(qweight, scales)
                offsets = _zero_offsets(qweight, qzeros, ctx.group_size)
                grad_scales = _group_sums(grad.float() * offsets, K, G, N).to(ctx.scales_dtype)
        return None, None, None, grad_scales, None, None


def _dequantize_jvp(qweight, qzeros, scales, group_size, out_dtype):
    """dequantize with scales' tangent, or None when scales has none. W is linear in
    the scales: its tangent is dequantize of the same words with the scales' tangent."""
    scales, tangent = _unpack(scales)
    if tangent is None:
        return None
    w = _DEQUANTIZE(qweight, qzeros, scales, group_size, out_dtype)
    return _fwad.make_dual(w, _DEQUANTIZE(qweight, qzeros, tangent, group_size, w.dtype))


def _dequantize_composite(qweight, qzeros, scales, group_size, out_dtype):
    """dequantize written with differentiable torch ops, for torch.func's transforms
    (grad, jacrev, vmap of grad), which cannot run an autograd.Function that an op's
    autograd kernel applies (nor one of torch.library.custom_op's): q - z exactly,
    times the scales in float32, rounded once to out_dtype -- the kernel's values."""
    _, G, _ = _groups(qweight, scales)
    w = _zero_offsets(qweight, qzeros, group_size) * scales.float().repeat_interleave(G, dim=0)
    return w.to(scales.dtype if out_dtype is None else out_dtype)


def _dequantize_autograd(keyset, qweight, qzeros, scales, group_size=None, out_dtype=None):
    if FWAD._current_level >= 0:
        w = _dequantize_jvp(qweight, qzeros, scales, group_size, out_dtype)
        if w is not None:
            return w
    if _C.is_grad_enabled() and scales.requires_grad:
        if _C._are_functorch_transforms_active():
            return _dequantize_composite(qweight, qzeros, scales, group_size, out_dtype)
        return _Dequantize.apply(keyset, qweight, qzeros, scales, group_size, out_dtype)
    return _without_grad(_DEQUANTIZE, _dequantize_kernel, keyset, qweight, qzeros, scales,
                         group_size, out_dtype)


_register("dequantize", _dequantize_kernel, _dequantize_fake, _dequantize_autograd)


# --- dequantize, out= variant -----------------------------------------------

def _dequantize_out_kernel(qweight, qzeros, scales, out, group_size=None):
    """Writes W into out, of out's dtype ([K, N], contiguous). No autograd."""
    _afd.dequantize(_bare(qweight), _bare(qzeros), _bare(scales),
                    group_size=group_size, out=out, out_dtype=out.dtype)


def _dequantize_out_fake(qweight, qzeros, scales, out, group_size=None):
    # The real kernel writes out's dtype: out.dtype is its out_dtype.
    _check_dequantize(qweight, qzeros, scales, group_size, out.dtype, out)
    return None


def _dequantize_out_autograd(keyset, qweight, qzeros, scales, out, group_size=None):
    if (_C.is_grad_enabled() and (scales.requires_grad or out.requires_grad)) or (
            FWAD._current_level >= 0 and (_unpack(scales)[1] is not None
                                      or _unpack(out)[1] is not None)):
        raise RuntimeError("dequantize_out(): functions with out=... arguments don't support "
                           "automatic differentiation, but one of the arguments requires grad "
                           "or carries a forward-mode tangent.")
    _below_autograd(_DEQUANTIZE_OUT, keyset, qweight, qzeros, scales, out, group_size)


def _dequantize_out_inplace_or_view(keyset, qweight, qzeros, scales, out, group_size=None):
    # out has changed: bump its version, as torch's own out= ops do, so that
    # autograd refuses to use what it saved of the old values. This key runs below
    # autograd and, for tensors that are not inference tensors, in inference mode too.
    with _C._AutoDispatchBelowADInplaceOrView():
        _DEQUANTIZE_OUT.redispatch(keyset & _C._after_ADInplaceOrView_keyset, qweight, qzeros,
                                   scales, out, group_size)
    torch.autograd.graph.increment_version(out)


_register("dequantize_out", _dequantize_out_kernel, _dequantize_out_fake,
          _dequantize_out_autograd)
_lib.impl("dequantize_out", _dequantize_out_inplace_or_view, "ADInplaceOrView", with_keyset=True)


# --- linear -----------------------------------------------------------------

def _linear_kernel(x, qweight, qzeros, scales, bias=None, group_size=None):
    """y [..., N] = x [..., K] @ W + bias, in x's dtype."""
    return _afd.linear(_bare(x), _bare(qweight), _bare(qzeros), _bare(scales),
                       None if bias is None else _bare(bias), group_size=group_size)


def _linear_fake(x, qweight, qzeros, scales, bias=None, group_size=None):
    _check_linear(x, qweight, qzeros, scales, bias, group_size)
    return x.new_empty((*x.shape[:-1], scales.shape[1]))


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, keyset, x, qweight, qzeros, scales, bias, group_size):
        ctx.group_size = group_size
        ctx.save_for_backward(x, qweight, qzeros, scales)
        return _below_autograd(_LINEAR, keyset, x, qweight, qzeros, scales, bias, group_size)

    @staticmethod
    def backward(ctx, grad):
        with _no_autocast(grad):
            return _Linear._backward(ctx, grad)

    @staticmethod
    def _backward(ctx, grad):
        x, qweight, qzeros, scales = ctx.saved_tensors
        K, G, N = _groups(qweight, scales)
        grad_x = grad_scales = grad_bias = None
        if ctx.needs_input_grad[1]:
            # y = x @ W  =>  dx = dy @ W^T, with W as the forward pass used it (x's dtype).
            W = _DEQUANTIZE(qweight, qzeros, scales, ctx.group_size, grad.dtype)
            grad_x = grad @ W.t()
        if ctx.needs_input_grad[4]:
            # dW = x^T dy (summed over every leading dimension), then as in dequantize.
            grad_w = x.reshape(-1, K).t().float() @ grad.reshape(-1, N).float()
            offsets = _zero_offsets(qweight, qzeros, ctx.group_size)
            grad_scales = _group_sums(grad_w * offsets, K, G, N).to(scales.dtype)
        if ctx.needs_input_grad[5]:
            grad_bias = grad.reshape(-1, N).float().sum(dim=0).to(grad.dtype)
        return None, grad_x, None, None, grad_scales, grad_bias, None


def _linear_jvp(x, qweight, qzeros, scales, bias, group_size):
    """linear with its tangent, or None when no input carries one:
    d(x @ W + bias) = dx @ W + x @ dW + dbias, where dW is dequantize of the same
    words with the scales' tangent (W is linear in the scales). The packed words are
    integers, which carry no tangent. The primal output is the op's own; the tangent
    is computed with differentiable ops, so that it has gradients too."""
    (x, dx), (scales, ds), (bias, db) = _unpack(x), _unpack(scales), _unpack(bias)
    if dx is None and ds is None and db is None:
        return None
    y = _LINEAR(x, qweight, qzeros, scales, bias, group_size)
    terms = []
    if dx is not None:
        terms.append(dx @ _DEQUANTIZE(qweight, qzeros, scales, group_size, dx.dtype))
    if ds is not None:
        terms.append(x @ _DEQUANTIZE(qweight, qzeros, ds, group_size, x.dtype))
    if db is not None:
        terms.append(db.expand(y.shape))
    tangent = terms[0]
    for term in terms[1:]:
        tangent = tangent + term
    return _fwad.make_dual(y, tangent)


def _linear_autograd(keyset, x, qweight, qzeros, scales, bias=None, group_size=None):
    if FWAD._current_level >= 0:
        y = _linear_jvp(x, qweight, qzeros, scales, bias, group_size)
        if y is not None:
            return y
    if _C.is_grad_enabled() and (x.requires_grad or scales.requires_grad
                                 or (bias is not None and bias.requires_grad)):
        if _C._are_functorch_transforms_active():
            y = x @ _dequantize_composite(qweight, qzeros, scales, group_size, x.dtype)
            return y if bias is None else y + bias
        return _Linear.apply(keyset, x, qweight, qzeros, scales, bias, group_size)
    return _without_grad(_LINEAR, _linear_kernel, keyset, x, qweight, qzeros, scales, bias,
                         group_size)


_register("linear", _linear_kernel, _linear_fake, _linear_autograd)


def _autocast_kernel(key):
    """linear's kernel for one autocast key: x (and bias) cast to the layer's own dtype,
    the scales', whatever autocast's dtype -- the weights are not recast -- then the op
    again with that key off, above autograd, so that gradients flow through the cast."""
    off = _C.DispatchKeySet(key)

    def kernel(x, qweight, qzeros, scales, bias=None, group_size=None):
        if x.is_floating_point() and x.dtype != scales.dtype:
            x = x.to(scales.dtype)
        if bias is not None and bias.is_floating_point() and bias.dtype != scales.dtype:
            bias = bias.to(scales.dtype)
        with _C._ExcludeDispatchKeyGuard(off):
            return _LINEAR(x, qweight, qzeros, scales, bias, group_size)
    return kernel


for _key in ("AutocastCPU", "AutocastCUDA"):
    _lib.impl("linear", _autocast_kernel(getattr(_C.DispatchKey, _key)), _key)


@register_flop_formula(torch.ops.awq_fast_dequant.linear)
def _linear_flops(x_shape, qweight_shape, *args, out_shape=None, **kwargs) -> int:
    """For torch.utils.flop_counter: the multiply-adds of x @ W, as for a dense matmul
    (the dequantization is not counted)."""
    return 2 * math.prod(x_shape) * out_shape[-1]
