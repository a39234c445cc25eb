"""AWQLinear, the AWQ layer as an nn.Module, and quantize_model, which puts it in a model."""

from __future__ import annotations

import contextlib
import itertools
import logging
import operator
import re
import sys
import time
from collections.abc import Iterable, Mapping, Sized

import torch
from torch import _C, nn

import awq_fast_dequant as _afd
from awq_fast_dequant.quant import _check_act_order, _check_grid, _check_refine
from awq_fast_dequant.reference import DTYPES

from . import _experts, _ops, _prefill

__all__ = ["AWQLinear", "quantize_model"]

logger = logging.getLogger("awq_fast_dequant")

_SCALE_DTYPES = tuple(getattr(torch, name) for name in DTYPES)
_BUFFERS = ("qweight", "qzeros", "scales", "bias")

# C, not Python: the eager forward pays no frame between the module and the launch.
_linear = _afd.linear
_module_call = _afd._C._module_call
_TENSOR = torch.Tensor
_FWAD = _ops.FWAD
_is_functorch_wrapped = _C._functorch.is_functorch_wrapped_tensor
_OLD_DLPACK = _ops.OLD_DLPACK
_get_tracing_state = _C._get_tracing_state
_is_compiling = torch.compiler.is_compiling
_is_grad_enabled = torch.is_grad_enabled

# What nn.Module's call looks at before it calls forward: a compiled call
# (Module.compile), a patched Module.__call__ or _call_impl (torch.fx's tracer
# patches __call__), the module's hooks and the global ones
# (torch.nn.modules.module), TorchScript tracing. AWQLinear's call checks the
# same and, where none of it is in play, calls forward without nn.Module's two
# frames; anything else goes through nn.Module's call. Before that, in eager
# mode, the C extension makes these checks and forward's own and runs linear()
# itself (csrc/module_call.c), at a fraction of their cost in Python
# (docs/BENCHMARKS.md, host overhead). A torch that keeps these elsewhere gets
# nn.Module's call always.
_MODULE_CALL = getattr(nn.Module, "_wrapped_call_impl", None)
_MODULE_CALL_IMPL = getattr(nn.Module, "_call_impl", None)
_GLOBAL_HOOKS = tuple(getattr(torch.nn.modules.module, f"_global_{kind}_hooks", None)
                      for kind in ("forward_pre", "forward", "backward_pre", "backward"))
_OWN_CALL = (_MODULE_CALL is not None and nn.Module.__call__ is _MODULE_CALL
             and getattr(nn.Module, "_compiled_call_impl", 0) is None
             and all(isinstance(hooks, dict) for hooks in _GLOBAL_HOOKS))


def _int32_words(t: torch.Tensor) -> torch.Tensor:
    """Packed words stored as uint32 (as some checkpoints hold them) as int32 views of
    the same bits, AWQLinear's dtype; any other tensor as it is."""
    return t.view(torch.int32) if t.dtype == torch.uint32 else t


def _without_memory(x: torch.Tensor, weights: tuple) -> bool:
    """x on the meta device, or x or a weight wrapped by torch.func."""
    return (x.is_meta or _is_functorch_wrapped(x)
            or any(t is not None and _is_functorch_wrapped(t) for t in weights))


def _positive(value, name: str) -> int:
    if isinstance(value, bool):  # an int to operator.index, but never meant as a size
        raise TypeError(f"{name} must be an integer; got {value!r}")
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer; got {value!r}") from None
    if n < 1:
        raise ValueError(f"{name} must be positive; got {n}")
    return n


def _group_size_arg(group_size) -> int:
    """-1 (one group per layer) for None or the integer -1, else the positive
    integer group_size (_positive refuses bool, float and the rest)."""
    if group_size is None:
        return -1
    try:
        if operator.index(group_size) == -1:
            return -1
    except TypeError:
        pass  # _positive says why
    return _positive(group_size, "group_size")


def _resolve_group_size(group_size, in_features: int) -> int:
    """G for a layer of in_features rows; -1 (or None) means one group per layer."""
    G = _group_size_arg(group_size)
    if G == -1:
        return in_features
    if in_features % G:
        raise ValueError(
            f"in_features must be a multiple of group_size; got in_features={in_features}, "
            f"group_size={G}")
    return G


def _scale_dtype(dtype, name: str = "dtype") -> torch.dtype:
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, dtype)
    if dtype not in _SCALE_DTYPES:
        raise TypeError(f"{name} must be torch.float16, torch.bfloat16 or torch.float32; "
                        f"got {dtype!r}")
    return dtype


class AWQLinear(nn.Module):
    """A linear layer whose weight is stored in the AWQ 4-bit "GEMM" layout.

    ``y = x @ W + bias`` with ``W = dequantize(qweight, qzeros, scales)`` of shape
    [in_features, out_features]; the matching nn.Linear weight is ``W.T``.

    Buffers (the names, shapes and dtypes of AutoAWQ's WQLinear_GEMM and of
    Hugging Face AWQ checkpoints, so ``load_state_dict`` takes a checkpoint's
    tensors as they are)::

        qweight  int32 [in_features, out_features / 8]
        qzeros   int32 [in_features / G, out_features / 8]
        scales   dtype [in_features / G, out_features]
        bias     dtype [out_features], or None

    ``group_size`` -1 means one group per layer (G = in_features). dtype is
    float16 (default), bfloat16 or float32 (on the GPU the CUDA-core kernel);
    x must have it.

    In eager mode forward calls the C extension directly; under torch.compile
    it calls the registered op ``torch.ops.awq_fast_dequant.linear``, which
    torch.compile traces without a graph break, and so it does under a dispatch
    mode, for a tensor subclass, a meta x or one torch.func wraps (vmap), inside
    a forward-mode AD level, and when autograd records the call. Gradients, and
    forward-mode tangents, flow to x (and to scales and bias if they are made to
    require grad, or made nn.Parameters); the packed weights are constants.

    fuse_projections groups layers that take the same input: their buffers
    become views into the group's, and the first of them called computes all.
    """

    # Set by fuse_projections: the group this layer is computed with, and its place in it.
    _siblings = None
    _sibling_index = None
    # Set by prepare_prefill: the prefill kernel's weight layout (_prefill.Prepared).
    _prefill = None

    def __init__(self, in_features: int, out_features: int, group_size: int = 128,
                 bias: bool = True, *, dtype=torch.float16, device=None):
        super().__init__()
        self.in_features = _positive(in_features, "in_features")
        self.out_features = _positive(out_features, "out_features")
        if self.out_features % 8:
            raise ValueError(
                f"out_features must be a multiple of 8 (eight 4-bit values per int32 word); "
                f"got {self.out_features}")
        self.group_size = _resolve_group_size(group_size, self.in_features)
        dtype = _scale_dtype(dtype)
        K, N, groups = self.in_features, self.out_features, self.in_features // self.group_size
        self.register_buffer("qweight", torch.zeros((K, N // 8), dtype=torch.int32, device=device))
        self.register_buffer("qzeros", torch.zeros((groups, N // 8), dtype=torch.int32,
                                                   device=device))
        self.register_buffer("scales", torch.zeros((groups, N), dtype=dtype, device=device))
        self.register_buffer("bias", torch.zeros(N, dtype=dtype, device=device) if bias else None)

    if _OWN_CALL:
        def __call__(self, *args, **kwargs):
            if not _is_compiling():  # torch.compile folds this and traces the rest
                y = _module_call(self, args, kwargs)
                if y is not NotImplemented:
                    return y
            forward_pre, forward, backward_pre, backward = _GLOBAL_HOOKS
            if (self._compiled_call_impl is None and nn.Module.__call__ is _MODULE_CALL
                    and nn.Module._call_impl is _MODULE_CALL_IMPL
                    and not (self._forward_pre_hooks or self._forward_hooks
                             or self._backward_pre_hooks or self._backward_hooks
                             or forward_pre or forward or backward_pre or backward)
                    and _get_tracing_state() is None):
                return self.forward(*args, **kwargs)
            return nn.Module.__call__(self, *args, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._siblings is not None:
            return self._siblings(self, x)
        b = self._buffers  # one dict lookup instead of four nn.Module.__getattr__ calls
        try:
            scales, bias = b["scales"], b["bias"]
        except KeyError:
            # scales or bias made an nn.Parameter (layer.bias = nn.Parameter(...)), which
            # nn.Module keeps in _parameters: the attributes, through the op, which
            # records the gradient.
            return _ops.linear(x, self.qweight, self.qzeros, self.scales, self.bias,
                               self.group_size)
        # The registered op wherever torch must see the call: under torch.compile or
        # export, under a dispatch mode (FakeTensorMode, FlopCounterMode, ...), for a
        # tensor subclass, inside a forward-mode AD level (x or a buffer may carry a
        # tangent; forward_ad keeps the level in a module global, -1 outside any), and
        # when autograd has to record it; and under torch.jit.trace, which records the
        # ops the dispatcher sees (a call it does not see would be traced as a constant).
        # is_compiling() comes first: torch.compile folds it to True and traces none of
        # the rest.
        if (_is_compiling() or _C._len_torch_dispatch_stack()
                or type(x) is not _TENSOR or _FWAD._current_level >= 0
                or _get_tracing_state() is not None
                or (_is_grad_enabled() and (
                    x.requires_grad or scales.requires_grad
                    or (bias is not None and bias.requires_grad)))):
            if scales.dtype not in _SCALE_DTYPES:
                self._check_scales_dtype()
            return _ops.linear(x, b["qweight"], b["qzeros"], scales, bias, self.group_size)
        if not x.is_contiguous():
            x = x.contiguous()
        if _OLD_DLPACK and (x.requires_grad or scales.requires_grad
                            or (bias is not None and bias.requires_grad)):
            # under no_grad: the same values, detached for Tensor.__dlpack__
            x, scales = x.detach(), scales.detach()
            bias = None if bias is None else bias.detach()
        if self._prefill is not None:
            y = _prefill.forward(self, x, b, bias)
            if y is not None:
                return y
        try:
            return _linear(x, b["qweight"], b["qzeros"], scales, bias, group_size=self.group_size)
        except TypeError:
            self._check_scales_dtype()
            weights = (b["qweight"], b["qzeros"], scales, bias)
            if not (_without_memory(x, weights)
                    or (torch.is_autocast_enabled(x.device.type) and (
                        x.dtype != scales.dtype
                        or (bias is not None and bias.dtype != scales.dtype)))):
                raise
        except ValueError:
            weights = (b["qweight"], b["qzeros"], scales, bias)
            if all(t is None or t.is_contiguous() for t in weights) and not x.is_neg():
                raise
        except RuntimeError:
            weights = (b["qweight"], b["qzeros"], scales, bias)
            if not (_OLD_DLPACK and _without_memory(x, weights)):
                raise  # not Tensor.__dlpack__ refusing a tensor that torch.func wraps
        # x without memory of its own: on the meta device (the op's fake kernel gives the
        # output, as nn.Linear does) or wrapped by torch.func (vmap, grad), or buffers that
        # torch.func wraps (vmap over stacked weights through functional_call); x or a
        # bias of another dtype under torch.autocast, which the op casts to the scales'
        # dtype; x with its negative bit set (a lazy negation), which the dispatcher
        # resolves; or a weight that is not contiguous (put in by
        # load_state_dict(assign=True), by assignment or by functional_call), which the op
        # makes contiguous
        return _ops.linear(x, *weights, self.group_size)

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int = 128, *, hessian=None,
                    grid=None, act_order=None, refine=None) -> "AWQLinear":
        """Quantize an nn.Linear with awq_fast_dequant.quantize into an AWQLinear
        on the same device: asymmetric, rounded to nearest (by default on each
        group's min-max grid, every weight within half a step of the original), or,
        given hessian (X^T X of the layer's inputs, [in_features, in_features]),
        GPTQ rounding. grid ("minmax" or "mse"), act_order and refine are quantize's.
        scales and bias get the weight's dtype (float16 for a float64 weight)."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be a torch.nn.Linear; got {type(linear).__name__}")
        weight = linear.weight
        if weight.is_meta:
            raise ValueError("linear has its weight on the meta device: there is nothing to "
                             "quantize")
        K, N = linear.in_features, linear.out_features
        if N % 8:
            raise ValueError(f"linear.out_features must be a multiple of 8; got {N}")
        G = _resolve_group_size(group_size, K)
        qweight, qzeros, scales = _afd.quantize(weight.detach().t(), group_size=G,
                                                hessian=hessian, grid=grid, act_order=act_order,
                                                refine=refine)
        device = weight.device
        bias = None
        if linear.bias is not None:
            bias = linear.bias.detach().to(device=device, dtype=scales.dtype, copy=True)
        return cls.from_tensors(qweight.to(device), qzeros.to(device), scales.to(device), bias)

    @classmethod
    def from_tensors(cls, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                     bias: torch.Tensor | None = None) -> "AWQLinear":
        """An AWQLinear holding these tensors (not copies) as its buffers, which
        must be contiguous; uint32 words are held as int32 views of the same
        memory. G is in_features / scales.shape[0]."""
        for name, t in (("qweight", qweight), ("qzeros", qzeros), ("scales", scales)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
        if bias is not None and not isinstance(bias, torch.Tensor):
            raise TypeError(f"bias must be a torch.Tensor or None; got {type(bias).__name__}")
        qweight, qzeros = _int32_words(qweight), _int32_words(qzeros)
        for name, t in (("qweight", qweight), ("qzeros", qzeros)):
            if t.dtype != torch.int32:
                raise TypeError(f"{name} must be int32 or uint32 (packed 4-bit words); got "
                                f"{t.dtype}")
        _scale_dtype(scales.dtype, "scales.dtype")
        for name, t in (("qweight", qweight), ("qzeros", qzeros), ("scales", scales)):
            if t.dim() != 2:
                raise ValueError(f"{name} must be 2-D; got shape {list(t.shape)}")
        K, words = qweight.shape
        N, rows = 8 * words, scales.shape[0]
        if K == 0 or words == 0:
            raise ValueError(f"qweight must be non-empty; got shape {list(qweight.shape)}")
        if rows == 0 or K % rows:
            raise ValueError(
                f"scales must have a number of rows dividing in_features={K} (rows of qweight); "
                f"got scales of shape {list(scales.shape)}")
        if tuple(scales.shape) != (rows, N):
            raise ValueError(f"scales must have shape [K/G, N] = [{rows}, {N}] for qweight of "
                             f"shape {list(qweight.shape)}; got {list(scales.shape)}")
        if tuple(qzeros.shape) != (rows, words):
            raise ValueError(f"qzeros must have shape [K/G, N/8] = [{rows}, {words}]; got "
                             f"{list(qzeros.shape)}")
        if bias is not None:
            if tuple(bias.shape) != (N,):
                raise ValueError(f"bias must have shape [{N}]; got {list(bias.shape)}")
            if bias.dtype != scales.dtype:
                raise TypeError(f"bias must have the dtype of scales ({scales.dtype}); "
                                f"got {bias.dtype}")
        devices = {t.device for t in (qweight, qzeros, scales, bias) if t is not None}
        if len(devices) > 1:
            raise ValueError(f"qweight, qzeros, scales and bias must be on one device; got "
                             f"{', '.join(sorted(map(str, devices)))}")
        # The layer holds the tensors themselves, and its eager forward hands them to the
        # C extension as they are, which reads C-contiguous memory only.
        for name, t in (("qweight", qweight), ("qzeros", qzeros), ("scales", scales),
                        ("bias", bias)):
            if t is not None and not t.is_contiguous():
                raise ValueError(f"{name} must be contiguous (the layer holds it, not a copy); "
                                 f"got strides {tuple(t.stride())} for shape {list(t.shape)}: "
                                 f"pass {name}.contiguous()")
        layer = cls(K, N, K // rows, bias is not None, dtype=scales.dtype, device="meta")
        layer.qweight, layer.qzeros, layer.scales = qweight, qzeros, scales
        layer.bias = bias
        return layer

    def dequantized_weight(self, dtype=None) -> torch.Tensor:
        """The dense weight as nn.Linear holds it: [out_features, in_features],
        contiguous, of dtype (default: the scales' dtype). Differentiable in the
        scales, and shapes only on the meta device or under FakeTensorMode."""
        if dtype is not None:
            dtype = _scale_dtype(dtype)
        self._check_scales_dtype()
        # Always the op: it records the gradient of the scales, gives the shape alone for
        # meta and fake tensors, and unwraps torch.func's; without any of these it calls
        # the C extension itself, and the dispatch costs little beside a K x N result.
        w = _ops.dequantize(self.qweight, self.qzeros, self.scales, self.group_size, dtype)
        return w.t().contiguous()

    def _check_scales_dtype(self) -> None:
        """Refuse scales that no AWQ layer holds, as a whole-model conversion such as
        model.double() leaves them, in words that point at that conversion."""
        dtype = self.scales.dtype
        if dtype not in _SCALE_DTYPES:
            raise TypeError(
                f"this AWQLinear's scales are {dtype}, which AWQ layers do not run: a "
                f"conversion of the whole model (model.double(), model.to({dtype})) "
                f"converted them; convert the model back with .half(), .bfloat16() or "
                f".float(), or convert only the modules that are not AWQLinear")

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        # copy_ into the int32 buffers would convert float or int64 values number by
        # number: the layer would compute with words that no checkpoint holds. Refused as
        # torch refuses a shape mismatch, with this layer left as it was. uint32 words (as
        # some checkpoints store them) are the same bits: loaded as int32 views, through a
        # copy of the mapping, so that the caller's stays as it was.
        refused, words = False, None
        for name in ("qweight", "qzeros"):
            key = prefix + name
            t = state_dict.get(key)
            if not isinstance(t, torch.Tensor) or t.dtype == torch.int32:
                continue
            if t.dtype == torch.uint32:
                words = dict(state_dict) if words is None else words
                words[key] = _int32_words(t)
                continue
            error_msgs.append(f"{key} must be int32 (8 packed 4-bit values per word, or "
                              f"uint32 words); the state dict holds {t.dtype}")
            refused = True
        if self._siblings is not None:
            self._siblings.pending.clear()  # parts computed from the weights loaded over
        if not refused:
            super()._load_from_state_dict(state_dict if words is None else words, prefix,
                                          local_metadata, strict, missing_keys,
                                          unexpected_keys, error_msgs)

    def __setattr__(self, name, value):
        if self._siblings is not None and name in _BUFFERS:
            self._siblings.dissolve()  # a buffer replaced: the group's copy is stale
        super().__setattr__(name, value)

    def register_buffer(self, name, tensor, persistent=True):
        if self._siblings is not None and name in _BUFFERS:
            self._siblings.dissolve()
        super().register_buffer(name, tensor, persistent)

    def _apply(self, fn, recurse=True):
        # The packed words are bits, not numbers: a conversion of every tensor
        # (module.type(torch.float16)) would turn them into floats of their integer
        # values. They keep int32 and go only where the conversion sends the tensor.
        words = {id(self._buffers.get("qweight")), id(self._buffers.get("qzeros"))}

        def keep_words(t):
            converted = fn(t)
            if id(t) in words and converted.dtype != t.dtype:
                return t.to(converted.device)
            return converted

        result = super()._apply(keep_words, recurse)
        group = self._siblings
        if group is not None and not group.intact():
            group.dissolve()  # converted: the views are copies now, or some are
        pre = self._prefill
        if pre is not None and not pre.fresh(self._buffers):  # unchanged buffers keep theirs
            min_rows = pre.min_rows
            self._prefill = pre = None  # the stale layout's memory goes before the new one is built
            self._prefill = _prefill.build(self, min_rows)  # the converted buffers' layout, or none
        return result

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self._siblings is not None:
            # Views into the group's buffers: saved as tensors of their own, so that no
            # two entries share memory (safetensors refuses that).
            for name in _BUFFERS:
                t = destination.get(prefix + name)
                if t is not None:
                    destination[prefix + name] = t.clone(memory_format=torch.contiguous_format)

    def extra_repr(self) -> str:
        K, N, G = self.in_features, self.out_features, self.group_size
        return (f"in_features={K}, out_features={N}, group_size={G}, "
                f"bias={self.bias is not None}, dtype={self.scales.dtype}, "
                f"qweight=[{K}, {N // 8}], qzeros=[{K // G}, {N // 8}], scales=[{K // G}, {N}]")


if _OWN_CALL:  # what _module_call checks (csrc/module_call.c)
    _afd._C._set_module_glue(nn.Module, _MODULE_CALL, _MODULE_CALL_IMPL, _GLOBAL_HOOKS,
                             _get_tracing_state, _C._len_torch_dispatch_stack,
                             _is_grad_enabled, _FWAD, _TENSOR, AWQLinear.forward)


# --- quantize_model -----------------------------------------------------------

def _skip_matcher(skip):
    """A predicate on module names from `skip`: strings match as substrings of
    the dotted name (the rule of modules_to_not_convert in AutoAWQ and in
    Hugging Face's AWQ loader), compiled regular expressions by re.search."""
    if skip is None:
        skip = ()
    elif isinstance(skip, (str, re.Pattern)):
        skip = (skip,)
    elif isinstance(skip, (bytes, bytearray)) or not isinstance(skip, Iterable):
        # bytes would iterate as ints, and a predicate is not a list of names.
        raise TypeError(f"skip must be a string, a compiled regular expression or an iterable "
                        f"of them (list, tuple, set); got {type(skip).__name__}")
    patterns = tuple(skip)
    for p in patterns:
        if not isinstance(p, (str, re.Pattern)):
            raise TypeError(f"skip must hold strings or compiled regular expressions; got "
                            f"{type(p).__name__} {p!r}")

    def match(name: str):
        for p in patterns:
            if (p in name) if isinstance(p, str) else p.search(name):
                return p if isinstance(p, str) else p.pattern
        return None

    return match, [p for p in patterns if isinstance(p, str)]


def _shared_weights(model: nn.Module) -> dict:
    """id(parameter) -> every name under which the model holds it."""
    names: dict = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return names


def _skip_reason(names: list, module: nn.Linear, G, match, shared, own_names):
    """(the name to report, why the module stays dense), or None to quantize it.
    A module held under several names is skipped if any of them matches skip."""
    for name in names:
        pattern = match(name)
        if pattern is not None:
            return name, f"matches skip pattern {pattern!r}"
    reason = _unfit_reason(module, G, shared, own_names)
    return None if reason is None else (names[0], reason)


# Subclasses of nn.Linear whose forward computes what nn.Linear's does (Falcon's:
# input @ weight.T, plus bias), by module and class name: quantized like nn.Linear.
_LINEAR_SUBCLASSES = {("transformers.models.falcon.modeling_falcon", "FalconLinear")}


def _unfit_reason(module: nn.Linear, G, shared, own_names) -> str | None:
    cls = type(module)
    if cls is not nn.Linear and (cls.__module__, cls.__qualname__) not in _LINEAR_SUBCLASSES:
        return (f"{type(module).__name__} is a subclass of nn.Linear whose forward may not "
                "be nn.Linear's")
    others = [n for n in shared.get(id(module.weight), ()) if n not in own_names]
    if others:
        return f"its weight is tied to {others[0]}; quantizing it would untie them"
    if module.weight.is_meta:
        return "its weight is on the meta device"
    if module.in_features == 0 or module.out_features == 0:
        return (f"it has no weights (in_features {module.in_features}, out_features "
                f"{module.out_features})")
    if module.out_features % 8:
        return f"out_features {module.out_features} is not a multiple of 8"
    if G != -1 and module.in_features % G:
        return f"in_features {module.in_features} is not a multiple of group_size {G}"
    return None


def quantize_model(model: nn.Module, group_size: int = 128, skip=("lm_head",),
                   calibration=None, *, grid=None, act_order=None, refine=None,
                   progress=False) -> list:
    """Replace, in place, every nn.Linear of `model` that fits the AWQ format
    (in_features a multiple of G, out_features a multiple of 8) by an AWQLinear
    (``AWQLinear.from_linear``).

    skip: names or patterns of modules to leave dense (default: ``lm_head``,
    which AWQ checkpoints keep dense). A string skips every module whose dotted
    name contains it, as ``modules_to_not_convert`` does; a compiled regular
    expression skips the names it matches (re.search). group_size -1 means one
    group per layer.

    calibration: None (each layer rounded to its min-max grid), or an iterable
    of model inputs, each run as ``model(**item)`` for a mapping,
    ``model(*item)`` for a tuple or list and ``model(item)`` otherwise, under
    torch.no_grad() with the model in eval mode (each module's mode is restored
    afterwards). Every layer to quantize records X^T X of the inputs it receives
    (float32, one [in_features, in_features] matrix per layer, on the layer's
    device; layers called one after another with the same tensor, such as
    attention's query, key and value, share one), and is then rounded by GPTQ
    with it (awq_fast_dequant.quantize's hessian). All statistics come from the
    unquantized model, in one pass over the data. Every position of every input
    counts: pass unpadded sequences
    (padding positions would count as text). A layer that the calibration never
    reaches is rounded to nearest, as without calibration (and logged).

    grid, act_order, refine: quantize's options, for every layer: grid "minmax" or
    "mse" (default: "mse" with calibration, "minmax" without); act_order (default:
    True with calibration; only with calibration); refine, the rounds of refinement
    after GPTQ (default: 2 with calibration; only with calibration).

    progress: show on stderr the calibration pass, input by input, then each
    layer as it is rounded (a tqdm bar when tqdm is installed, else a line a
    step). GPTQ takes seconds per large layer, so a whole model takes minutes.

    Fused experts (a mixture-of-experts module of transformers 5 with 3-D
    gate_up_proj and down_proj parameters) first become an UnfusedExperts, one
    nn.Linear per expert projection, each then quantized like any other layer;
    if quantizing fails, the fused modules are put back.

    Also left dense: subclasses of nn.Linear (their forward may differ),
    layers whose weight is tied to another module's, layers on the meta
    device, and fused experts that skip matches or in a layout UnfusedExperts
    does not take. A layer to quantize with a float64 weight is refused
    (TypeError) before anything changes: convert the model to float32, float16 or
    bfloat16 first. Returns the skipped layers as a list of (name, reason), which is
    also logged (logger "awq_fast_dequant"). A Hugging Face model's
    ``config.quantization_config`` is set to describe the result, so that the
    model's own ``save_pretrained`` writes an AWQ checkpoint that
    load_pretrained reads back.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module; got {type(model).__name__}")
    if isinstance(model, nn.Linear):
        raise TypeError("model is itself an nn.Linear, which cannot be replaced in place; "
                        "use AWQLinear.from_linear(model, group_size)")
    G = _group_size_arg(group_size)
    match, skip_strings = _skip_matcher(skip)
    _check_group_size_of_earlier_calls(model, G)
    if calibration is not None:
        _check_calibration(calibration)
    # Refused here, before the calibration pass, rather than by the first layer.
    _check_grid(grid, calibration is not None)
    # act_order's type first (as if calibrated), then what it needs, in this API's words
    if _check_act_order(act_order, True) and act_order is not None and calibration is None:
        raise ValueError("act_order=True needs calibration: the rows are ordered by the "
                         "energy of each layer's inputs, which the calibration pass records")
    if _check_refine(refine, True) and refine is not None and calibration is None:
        raise ValueError("refine > 0 needs calibration: it lowers each layer's GPTQ loss, "
                         "which the calibration pass's statistics define")
    # Fused experts (transformers' 3-D expert tensors) become one nn.Linear per expert
    # projection first; all is put back if quantizing fails.
    fused_skipped, unfused = _unfuse_experts(model, match)
    try:
        skipped = _quantize_linears(model, G, match, skip_strings, calibration, grid,
                                    act_order, refine, progress)
    except BaseException:
        for parent, child, original, _ in unfused:
            setattr(parent, child, original)
        raise
    for _, _, _, experts in unfused:
        _experts.own_weights(experts)  # the fused tensors are freed with the fused module
    for name, reason in fused_skipped:
        logger.info("quantize_model: %s left dense: %s", name, reason)
    return fused_skipped + skipped


def _unfuse_experts(model: nn.Module, match):
    """Puts an UnfusedExperts in place of every fused experts module of `model` that
    skip does not match. Returns ([(name, why it stays fused)], [(parent, child name,
    the fused module, its UnfusedExperts)])."""
    skipped, unfused = [], []
    names = None
    for name, module in list(model.named_modules()):
        if not _experts.looks_fused(module):
            continue
        pattern = match(name)
        if pattern is not None:
            skipped.append((name, f"matches skip pattern {pattern!r}"))
            continue
        if _experts.fused_shapes(module) is None:
            skipped.append((name, f"{type(module).__name__} holds its experts in 3-D tensors in "
                                  "a layout other than transformers' standard one (gate_up_proj "
                                  "[E, 2I, H] and down_proj [E, H, I], no biases, the default "
                                  "gate), which UnfusedExperts does not take"))
            continue
        if any(p.is_meta for p in module.parameters()):
            skipped.append((name, "its experts' weights are on the meta device"))
            continue
        if names is None:
            names = _experts.expert_names(model)
        experts = _experts.unfuse(module, names)
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, experts)
        unfused.append((parent, child, module, experts))
    return skipped, unfused


def _quantize_linears(model, G, match, skip_strings, calibration, grid, act_order, refine,
                      progress) -> list:
    shared = _shared_weights(model)

    linears = [(name, m) for name, m in model.named_modules(remove_duplicate=False)
               if isinstance(m, nn.Linear)]
    # A module held under several names is one layer, whose weight is not "tied" to itself.
    module_names: dict = {}
    for name, m in linears:
        module_names.setdefault(id(m), []).append(name)

    skipped, chosen = [], {}
    for name, module in linears:
        if id(module) in chosen:
            continue
        names = module_names[id(module)]
        skip_entry = _skip_reason(names, module, G, match, shared,
                                  {f"{n}.weight" for n in names})
        if skip_entry is not None:
            skipped.append(skip_entry)
            chosen[id(module)] = None
        elif module.weight.dtype not in _SCALE_DTYPES:
            # from_linear would give float16 scales, which the model's own float64
            # activations could not feed. Nothing has changed yet.
            dtype = module.weight.dtype
            raise TypeError(
                f"{name} has a {dtype} weight; AWQ layers run float16, bfloat16 or float32, "
                f"and the rest of the model would feed them {dtype} inputs: convert the model "
                f"first (model.float(), model.half() or model.bfloat16())")
        else:
            chosen[id(module)] = module

    hessians: dict = {}
    if calibration is not None:
        targets = {key: m for key, m in chosen.items() if m is not None}
        total = len(calibration) if isinstance(calibration, Sized) else None
        with _Progress(progress, "calibration", total, "input") as bar:
            hessians, items = _input_statistics(model, targets, calibration, bar)
        unreached = [name for name, m in linears
                     if chosen[id(m)] is not None and id(m) not in hessians]
        for name in unreached:
            logger.info("quantize_model: %s received no calibration input; rounded to "
                        "nearest", name)
        logger.info("quantize_model: %d calibration inputs, %d layers calibrated",
                    items, len(hessians))

    # Every layer is built before the first one is replaced: a layer that cannot be
    # quantized leaves the model as it was.
    new: dict = {}
    to_round = sum(m is not None for m in chosen.values())
    with _Progress(progress, "quantize", to_round, "layer") as bar:
        for name, module in linears:
            if id(module) in new or chosen[id(module)] is None:
                continue
            hessian = hessians.pop(id(module), None)
            start = time.perf_counter()
            try:
                # act_order orders by the hessian, and refine lowers its loss: a layer
                # without one is rounded to nearest, in row order.
                calibrated = hessian is not None
                layer = AWQLinear.from_linear(module, G, hessian=hessian, grid=grid,
                                              act_order=act_order if calibrated else None,
                                              refine=refine if calibrated else None)
            except ValueError as e:
                raise ValueError(f"{name} cannot be quantized: {e}") from e
            new[id(module)] = layer.train(module.training)
            bar.step(f"{name} {module.in_features}x{module.out_features} "
                     f"{time.perf_counter() - start:.1f} s")
    for name, module in linears:
        if id(module) in new:
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, new[id(module)])

    replaced = len(new)
    for name, reason in skipped:
        logger.info("quantize_model: %s left dense: %s", name, reason)
    logger.info("quantize_model: %d nn.Linear layers quantized (group_size %d), %d left dense",
                replaced, G, len(skipped))
    _describe_quantization(model, G, skip_strings,
                           {name: None for name, m in linears if chosen[id(m)] is None})
    return skipped


def _check_calibration(calibration) -> None:
    # A lone input would be iterated: a dict by its keys, a tensor by its rows, a
    # string by its characters.
    if isinstance(calibration, (str, bytes, bytearray)):
        raise TypeError(f"calibration must be an iterable of model inputs, not a "
                        f"{type(calibration).__name__}: tokenize the text first "
                        f"([tokenizer(text, return_tensors='pt') for text in texts])")
    if isinstance(calibration, (torch.Tensor, Mapping)):
        raise TypeError(f"calibration must be an iterable of model inputs; got a single "
                        f"{type(calibration).__name__}: wrap it in a list ([inputs])")
    try:
        iter(calibration)
    except TypeError:
        raise TypeError(f"calibration must be an iterable of model inputs (mappings of "
                        f"tensors, tuples or tensors); got {type(calibration).__name__}"
                        ) from None


class _Progress:
    """quantize_model's progress on stderr: a tqdm bar when tqdm is installed,
    else a line a step; nothing when not enabled."""

    def __init__(self, enabled: bool, stage: str, total, unit: str):
        self.enabled, self.stage, self.total, self.done = bool(enabled), stage, total, 0
        self.bar = None
        if self.enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self.bar = tqdm(total=total, desc=f"quantize_model {stage}", unit=unit,
                            dynamic_ncols=True, file=sys.stderr)

    def step(self, what: str = "") -> None:
        self.done += 1
        if self.bar is not None:
            if what:
                self.bar.set_postfix_str(what, refresh=False)
            self.bar.update(1)
        elif self.enabled:
            total = "?" if self.total is None else self.total
            print(f"quantize_model {self.stage} [{self.done}/{total}] {what}".rstrip(),
                  file=sys.stderr, flush=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()


def _input_statistics(model: nn.Module, targets: dict, calibration, bar: _Progress):
    """({id(layer): X^T X of its inputs}, number of inputs run) for the layers in
    targets (id -> nn.Linear), from running `calibration` through the model;
    bar steps once an input. Layers that have received the same inputs share one
    matrix (the same tensor under each id)."""
    stats = _SharedStatistics()

    def record(layer, x):
        if not isinstance(x, torch.Tensor) or x.shape[-1:] != (layer.in_features,):
            return  # the layer's own forward refuses it, in its own words
        stats.record(id(layer), x)

    items = 0
    with _recording_inputs(model, targets.values(), record):
        for item in calibration:
            _run_input(model, item)
            stats.flush()
            items += 1
            bar.step()
    if items == 0:
        raise ValueError("calibration must yield at least one model input; it yielded none")
    return stats.per_layer(), items


@contextlib.contextmanager
def _recording_inputs(model: nn.Module, layers, record):
    """model in eval mode under torch.no_grad, record(layer, input) called as each of
    `layers` is about to run; the hooks removed and every module's mode restored
    after."""
    def hook(layer, args, kwargs):
        record(layer, args[0] if args else kwargs.get("input"))

    hooks = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in layers]
    modes = [(m, m.training) for m in model.modules()]
    try:
        model.eval()
        with torch.no_grad():
            yield
    finally:
        for h in hooks:
            h.remove()
        for m, training in modes:
            m.training = training


def _run_input(model: nn.Module, item) -> None:
    """model(**item) for a mapping, model(*item) for a tuple or list, else model(item)."""
    if isinstance(item, Mapping):
        model(**item)
    elif isinstance(item, (tuple, list)):
        model(*item)
    else:
        model(item)


def _version_of(x: torch.Tensor):
    """x's version counter, None for a tensor without one (made under
    torch.inference_mode), which then shares with no other layer."""
    try:
        return x._version
    except RuntimeError:
        return None


class _SharedStatistics:
    """X^T X of each layer's inputs, one matrix for the layers whose inputs have
    been the same tensors, in the same order, so far.

    Attention's query, key and value projections are called one after another
    with one tensor, and so are an FFN's gate and up projections: they share a
    matrix, and x^T x is computed once an input. Layers called one after another
    with the same tensor object, unchanged in between (its version counter),
    form a run; x^T x is taken when the run starts, since the tensor may change
    once read. A run adds it to each group of layers wholly inside it, and
    splits a group that it covers only in part: the part inside goes on with a
    copy of the group's matrix. So every layer's matrix is the sum of x^T x over
    exactly its own inputs, in their order, as a matrix of its own would be.
    """

    def __init__(self):
        self.group: dict = {}    # layer id -> group key
        self.members: dict = {}  # group key -> set of layer ids
        self.sums: dict = {}     # group key -> float32 [in, in]
        self.keys = itertools.count()
        self.run = None          # (x, its version, x^T x, [layer ids]) not yet added

    def record(self, layer: int, x: torch.Tensor) -> None:
        run, version = self.run, _version_of(x)
        if (run is not None and x is run[0] and version is not None and version == run[1]
                and layer not in run[3]):
            run[3].append(layer)
            return
        self.flush()
        flat = x.detach().reshape(-1, x.shape[-1]).float()
        self.run = (x, version, flat.T @ flat, [layer])

    def flush(self) -> None:
        """Add the pending run to the sums."""
        if self.run is None:
            return
        _, _, product, layers = self.run
        self.run = None
        inside = set(layers)
        for key in {self.group[i] for i in layers if i in self.group}:
            members = self.members[key]
            if members <= inside:
                self.sums[key].add_(product)
                continue
            # Only some of the group received x: they go on with a matrix of their own.
            part, split = members & inside, next(self.keys)
            members -= part
            self.members[split], self.sums[split] = part, self.sums[key] + product
            self.group.update(dict.fromkeys(part, split))
        new = [i for i in layers if i not in self.group]
        if new:
            key = next(self.keys)
            self.members[key], self.sums[key] = set(new), product
            self.group.update(dict.fromkeys(new, key))

    def per_layer(self) -> dict:
        self.flush()
        return {layer: self.sums[key] for layer, key in self.group.items()}


def _awq_config(model: nn.Module):
    """A Hugging Face model's config.quantization_config as a dict when it describes
    AWQ weights; None for other models and configurations."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        return None
    qc = getattr(config, "quantization_config", None)
    if qc is not None and not isinstance(qc, Mapping) and hasattr(qc, "to_dict"):
        qc = qc.to_dict()  # transformers' AwqConfig
    if not isinstance(qc, Mapping) or str(qc.get("quant_method", "")).lower() != "awq":
        return None
    return qc


def _check_group_size_of_earlier_calls(model: nn.Module, G: int) -> None:
    """A model quantized in parts (several calls) has one config.quantization_config,
    which holds one group size: refuse another before anything changes."""
    earlier = _awq_config(model)
    if earlier is None or earlier.get("group_size") == G:
        return
    if any(isinstance(m, AWQLinear) for m in model.modules()):
        raise ValueError(
            f"group_size {G} differs from {earlier.get('group_size')}, the group size of the "
            f"layers already quantized in this model (config.quantization_config): an AWQ "
            f"checkpoint has one group size; pass group_size={earlier.get('group_size')}")


def _keeps_dense(entry: str, name: str) -> bool:
    """Whether a modules_to_not_convert entry keeps the module `name` dense, by AutoAWQ's
    rule (a substring of the name) or by transformers' (a prefix or regular expression
    ending at a module boundary, or a suffix)."""
    if entry in name:  # a suffix too
        return True
    try:
        return re.match(rf"(?:{entry})(?:(?<=\.)|(?=\.|$))", name) is not None
    except re.error:
        return False


def _describe_quantization(model: nn.Module, G: int, skip_strings, dense) -> None:
    """Sets a Hugging Face model's config.quantization_config (no-op for other models).
    dense: the names of every nn.Linear this call left dense, in order (a dict). A model
    quantized in parts keeps what the earlier calls listed, less any entry that would now
    keep a quantized layer dense (a skip string of an earlier call that this one has
    quantized)."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        return
    earlier = _awq_config(model)
    before = list((earlier or {}).get("modules_to_not_convert") or ())
    quantized = [name for name, m in model.named_modules(remove_duplicate=False)
                 if isinstance(m, AWQLinear)]
    not_converted = [
        entry for entry in dict.fromkeys([*before, *skip_strings, *dense])
        if entry in dense or not any(_keeps_dense(entry, q) for q in quantized)]
    config.quantization_config = {
        "quant_method": "awq", "bits": 4, "group_size": G, "zero_point": True,
        "version": "gemm", "modules_to_not_convert": not_converted or None,
    }
