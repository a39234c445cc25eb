"""fuse_projections: AWQLinear layers that take the same input, computed by one call.

Attention's query, key and value projections are called one after another with one
tensor, and so are a gated MLP's gate and up projections. At small batch each call
is a kernel that streams its weights, and the small ones (key and value under
grouped-query attention) are bound by the kernel's fixed cost, not by memory. With
their packed weights side by side in one tensor, one linear() call computes the
whole group: the first member called computes every member's output, and the
others, called next with the same tensor, take theirs.

The members keep their buffers, as views into the group's concatenated ones, so
that state_dict, load_state_dict and the module tree stay as they were.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from . import _ops, _prefill
from ._experts import UnfusedExperts
from ._module import _BUFFERS, AWQLinear, _recording_inputs, _run_input, _version_of

__all__ = ["fuse_projections", "unfuse_projections"]

logger = logging.getLogger("awq_fast_dequant")

_grad_enabled = torch.is_grad_enabled
_is_compiling = torch.compiler.is_compiling
_dispatch_modes = torch._C._len_torch_dispatch_stack


def _is_exporting() -> bool:
    """torch.compiler.is_exporting(), read from its flag: torch.compile of torch
    2.11 takes the function itself for True, whatever it traces for. Where torch
    has no such flag, export fuses as torch.compile does."""
    return getattr(torch.compiler, "_is_exporting_flag", False)


def _alone(layer, x):
    """layer's output through the registered op, from its own buffers."""
    return _ops.linear(x, layer.qweight, layer.qzeros, layer.scales, layer.bias,
                       layer.group_size)


class Siblings:
    """The members of one fused group and the layer that computes them all.

    ``fused`` is an AWQLinear (not in any module tree) over the members' buffers
    concatenated along out_features; each member's buffers are views into its.
    ``pending`` holds, for the members not yet called, their part of the last
    output, with the input it came from.
    """

    def __init__(self, members: list, fused: nn.Module):
        self.members = members
        self.fused = fused
        self.sizes = [m.out_features for m in members]
        self.views = [tuple(m._buffers[name] for name in _BUFFERS) for m in members]
        self.pending: dict = {}

    def __call__(self, layer, x: torch.Tensor) -> torch.Tensor:
        if self.fused is None:
            # dissolved while a copy of a member (copy.copy, DataParallel's replicas)
            # still pointed at it: that copy computes alone from now on
            layer._siblings = layer._sibling_index = None
            return layer.forward(x)
        index = layer._sibling_index
        pending = self.pending
        grad = _grad_enabled()
        compiling = _is_compiling()
        if compiling and _is_exporting():
            # An exported program holds the layers' own buffers: each computes itself.
            return _alone(layer, x)
        # Under torch.compile, which traces the calls in order, a version counter
        # cannot be read.
        version = None if compiling else _version_of(x)
        hit = pending.pop(index, None)
        # The member's part of an output computed from this very tensor, unchanged
        # since, in the same grad mode.
        if hit is not None and hit[0] is x and hit[1] == version and hit[2] == grad:
            return hit[3]
        pending.clear()
        if not self.intact():  # a buffer replaced in place of the module's own setattr
            if compiling or _dispatch_modes():
                return _alone(layer, x)  # traced, buffers swapped in for the trace
            self.dissolve()
            return layer.forward(x)
        if grad and self.learns():
            # The group's buffers are not the member's: autograd must see its own.
            return _alone(layer, x)
        out = self.fused.forward(x)
        if out.requires_grad:
            # Views made one at a time, which autograd lets the caller change in place
            # (as an activation function may); those of one split it does not.
            parts, start = [], 0
            for size in self.sizes:
                parts.append(out.narrow(-1, start, size))
                start += size
        else:
            # split_with_sizes: Tensor.split's Python wrapper costs as much again
            parts = out.split_with_sizes(self.sizes, -1)
        for i, part in enumerate(parts):
            if i != index:
                pending[i] = (x, version, grad, part)
        return parts[index]

    def intact(self) -> bool:
        """Whether every member still holds the views it was given (a device or
        dtype conversion replaces them, and so does code that writes a module's
        _buffers itself; an assignment dissolves the group first)."""
        for m, views in zip(self.members, self.views):
            b = m._buffers
            for name, view in zip(_BUFFERS, views):
                if b.get(name) is not view:
                    return False
        return True

    def learns(self) -> bool:
        """Whether a member's buffer requires grad (set after fusing: a trainable scale
        or bias), which the group's concatenated copy does not."""
        return any(view is not None and view.requires_grad
                   for views in self.views for view in views)

    def dissolve(self) -> None:
        """Give every member buffers of its own again (copies of its views, or of
        what replaced them where that still shares the group's memory) and forget
        the group."""
        if self.fused is None:
            return  # dissolved already
        self.pending.clear()
        whole = [t for t in self.fused._buffers.values() if t is not None]
        for m in self.members:
            for name in _BUFFERS:
                t = m._buffers.get(name)
                if t is not None and any(_shares(t, w) for w in whole):
                    with torch.no_grad():  # a buffer of its own, not a result of its view
                        own = t.clone(memory_format=torch.contiguous_format)
                    m._buffers[name] = own.requires_grad_(t.requires_grad)
            m._siblings = None
            m._sibling_index = None
        self.members, self.views, self.fused = [], [], None

    def __getstate__(self):
        state = self.__dict__.copy()
        state["pending"] = {}
        return state


def _shares(t: torch.Tensor, whole: torch.Tensor) -> bool:
    if t.device != whole.device or t.is_meta:
        return False
    try:
        return t.untyped_storage().data_ptr() == whole.untyped_storage().data_ptr()
    except RuntimeError:  # a tensor without memory (a fake tensor of a trace)
        return False


def _layers(model: nn.Module) -> dict:
    return {m: name for name, m in model.named_modules() if isinstance(m, AWQLinear)}


def unfuse_projections(model: nn.Module) -> None:
    """Undo fuse_projections: every fused AWQLinear of model gets buffers of its
    own again (contiguous copies; the concatenated ones are freed)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module; got {type(model).__name__}")
    for m in _layers(model):
        if m._siblings is not None:
            m._siblings.dissolve()


def fuse_projections(model: nn.Module, example=None) -> list[tuple[str, ...]]:
    """Fuse the AWQLinear layers of model that are called one after another with
    the same input -- attention's query, key and value projections, a gated
    MLP's gate and up projections -- so that one linear() call computes each
    such group. Returns the groups fused, as tuples of module names.

    Which layers those are is seen by running model once on ``example`` (under
    torch.no_grad, in eval mode): a mapping runs as ``model(**example)``, a
    tuple or list as ``model(*example)``, anything else as ``model(example)``.
    By default the model's own ``dummy_inputs`` (transformers models have them),
    moved to the device of its AWQ layers. Layers fuse when they are children of
    one module, are called in a row with one tensor, unchanged in between, and
    agree in in_features, group_size, device, dtype and having a bias; a layer
    called in more than one such way is left alone. Each expert's gate and up
    projections in an UnfusedExperts fuse whether or not the example reaches
    the expert (its forward calls them that way).

    Outputs are those of the same layers unfused, within linear()'s tolerance
    (one call over the concatenated weights sums in its own order); they are
    views into one [..., sum of out_features] tensor. The first member called
    computes the whole group; the others return their part when called next with
    the same tensor (in eager mode also unchanged, by its version counter), and
    compute the whole group again otherwise. The members' buffers become views
    into the group's, so state_dict and load_state_dict work as before
    (state_dict gives contiguous copies of them). Converting the model
    (``.to(device)``, ``.half()``) or assigning buffers unfuses the group the
    layers were in; call fuse_projections again after. unfuse_projections
    undoes it."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module; got {type(model).__name__}")
    layers = _layers(model)
    unfuse_projections(model)
    if not layers:
        return []
    if example is None:
        example = getattr(model, "dummy_inputs", None)
        if example is None:
            raise TypeError(
                f"fuse_projections needs an example input of the model: "
                f"{type(model).__name__} has no dummy_inputs; pass example= (a mapping of "
                f"keyword arguments, a tuple of positional ones, or a tensor)")
        device = next(iter(layers)).qweight.device
        example = {k: v.to(device) if isinstance(v, torch.Tensor) else v
                   for k, v in example.items()}
    parent = {}
    for m, name in layers.items():
        parent[m] = name.rpartition(".")[0]
    runs = _observe(model, layers, example) + _expert_pairs(model, layers)
    group_of: dict = {}
    for run in runs:
        for m in run:
            if group_of.setdefault(m, run) != run:
                group_of[m] = None  # called in two different ways
    fused = []
    seen = set()
    for run in runs:
        if run in seen or len(run) < 2 or any(group_of.get(m) != run for m in run):
            continue
        seen.add(run)
        if len({parent[m] for m in run}) != 1 or not _compatible(run):
            continue
        _fuse(list(run))
        fused.append(tuple(layers[m] for m in run))
    for names in fused:
        logger.info("fuse_projections: %s computed by one call", ", ".join(names))
    return fused


def _observe(model: nn.Module, layers: dict, example) -> list[tuple]:
    """The runs of AWQ layers called one after another with one unchanged tensor,
    in one forward of model on example."""
    calls = []

    def record(layer, x):
        calls.append((layer, x, _version_of(x) if isinstance(x, torch.Tensor) else None))

    with _recording_inputs(model, layers, record):
        _run_input(model, example)
    runs, run, last = [], [], None
    for layer, x, version in calls:
        if (run and isinstance(x, torch.Tensor) and x is last[0] and version is not None
                and version == last[1] and layer not in run):
            run.append(layer)
            continue
        if run:
            runs.append(tuple(run))
        run, last = [layer], (x, version)
    if run:
        runs.append(tuple(run))
    return runs


def _expert_pairs(model: nn.Module, layers: dict) -> list[tuple]:
    """(gate, up) of every expert of every UnfusedExperts: its forward calls them in
    a row with one tensor, whether or not the example routes a token to the expert."""
    pairs = []
    for module in model.modules():
        if isinstance(module, UnfusedExperts):
            gate, up, _ = module.names
            for expert in module._modules.values():
                pair = (getattr(expert, gate, None), getattr(expert, up, None))
                if all(layer in layers for layer in pair):
                    pairs.append(pair)
    return pairs


def _compatible(run) -> bool:
    first = run[0]
    key = (first.in_features, first.group_size, first.qweight.device, first.scales.dtype,
           first.bias is None)
    for m in run:
        if (m.in_features, m.group_size, m.qweight.device, m.scales.dtype,
                m.bias is None) != key:
            return False
        for name in _BUFFERS:
            t = m._buffers.get(name)
            if t is None and (name != "bias" or m.bias is not None):
                return False  # a buffer made an nn.Parameter: left as it is
            if t is not None and (t.is_meta or t.requires_grad or not t.is_contiguous()):
                return False
    return True


def _fuse(members: list) -> None:
    first = members[0]
    N = sum(m.out_features for m in members)
    fused = AWQLinear(first.in_features, N, first.group_size, first.bias is not None,
                      dtype=first.scales.dtype, device="meta")
    views = []  # every buffer made before any member's is replaced
    with torch.no_grad():
        for name in _BUFFERS:
            if first._buffers.get(name) is None:
                continue
            whole = torch.cat([m._buffers[name] for m in members], dim=-1)
            fused._buffers[name] = whole
            start = 0
            for m in members:
                width = m._buffers[name].shape[-1]
                views.append((m, name, whole.narrow(-1, start, width)))
                start += width
    for m, name, view in views:
        m._buffers[name] = view
    group = Siblings(members, fused)
    for i, m in enumerate(members):
        m._siblings, m._sibling_index = group, i
    layouts = [m.__dict__.pop("_prefill", None) for m in members]
    layouts = [p for p in layouts if p is not None]
    if layouts:  # prepare_prefill's layout, now the group's
        fused._prefill = _prefill.build(fused, layouts[0].min_rows)
