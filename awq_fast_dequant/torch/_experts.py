"""Mixture-of-experts layers: transformers' fused experts, one module per expert.

transformers 5 keeps the experts of a mixture-of-experts layer (Mixtral,
Qwen2-MoE, Qwen3-MoE, DeepSeek-V2/V3, OLMoE, ...) in one module whose
parameters are 3-D: ``gate_up_proj`` [E, 2I, H] (each expert's gate
projection, then its up projection) and ``down_proj`` [E, H, I]. Its
from_pretrained merges the per-expert layers of a checkpoint into them, and
save_pretrained splits them again. An AWQ checkpoint quantizes every expert's
layers one by one (``experts.<e>.w1.qweight``, ...), which no 3-D tensor can
hold; so quantize_model and load_pretrained put an UnfusedExperts in place of
such a module: one module per expert, each with an nn.Linear (then an
AWQLinear) per projection, under the checkpoint's own names, and the fused
module's forward.
"""

from __future__ import annotations

import re

import torch
from torch import nn

__all__ = ["UnfusedExperts"]

# The names of each expert's gate, up and down projections when transformers
# gives none (a model without a conversion of per-expert checkpoint tensors).
DEFAULT_NAMES = ("gate_proj", "up_proj", "down_proj")


class UnfusedExperts(nn.Module):
    """The experts of a mixture-of-experts layer, one submodule each (``"0"``,
    ``"1"``, ...), each holding its gate, up and down projections under
    `names`, with the forward of transformers' fused experts modules::

        forward(hidden_states [T, H], top_k_index [T, k], top_k_weights [T, k]) -> [T, H]

    Expert e adds ``down(act_fn(gate(x)) * up(x)) * weight`` to the output row of
    every token routed to it (weight: the token's routing weight for e), the experts
    in order and each one's tokens in transformers' order, so that the sums are
    those of the fused module; an index outside 0..E-1 (a sentinel) routes nowhere.
    The projections are nn.Linear or AWQLinear, or any module that maps [.., in] to
    [.., out]. Unlike transformers' loop, which reads on the host which experts are
    hit and then each one's tokens, it reads the counts of all experts' tokens
    once.
    """

    def __init__(self, experts, names=DEFAULT_NAMES, act_fn: nn.Module | None = None):
        super().__init__()
        self.names = tuple(names)
        if len(self.names) != 3 or len(set(self.names)) != 3:
            raise ValueError(f"names must be three different names (gate, up, down); "
                             f"got {names!r}")
        self.num_experts = 0
        for expert in experts:
            self.add_module(str(self.num_experts), expert)
            self.num_experts += 1
        self.act_fn = act_fn if act_fn is not None else nn.SiLU()

    def expert(self, e: int) -> nn.Module:
        return self._modules[str(e)]

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        gate, up, down = self.names
        E, T = self.num_experts, hidden_states.shape[0]
        out = torch.zeros_like(hidden_states)
        with torch.no_grad():
            # The (position, token) pairs by expert, and within an expert by position, then
            # token: the order transformers' loop visits them in. One read on the host (the
            # count of each expert's tokens) instead of one per expert.
            flat = top_k_index.t().reshape(-1)  # pair p * T + t
            flat = torch.where((flat >= 0) & (flat < E), flat, E)  # sentinels last
            order = torch.argsort(flat, stable=True)
            counts = torch.bincount(flat, minlength=E + 1).tolist()
            tokens = order % T
        # Every pair's input row and routing weight, gathered once in that order: each
        # expert's are then a slice (a view).
        xs = hidden_states[tokens]
        weights = top_k_weights.t().reshape(-1)[order]
        start = 0
        for e in range(E):
            count = counts[e]
            if not count:
                continue
            rows = slice(start, start + count)
            start += count
            expert = self._modules[str(e)]
            x = xs[rows]
            h = self.act_fn(getattr(expert, gate)(x)) * getattr(expert, up)(x)
            h = getattr(expert, down)(h) * weights[rows, None]
            out.index_add_(0, tokens[rows], h.to(out.dtype))
        return out

    def extra_repr(self) -> str:
        return f"num_experts={self.num_experts}, names={self.names}"


def looks_fused(module: nn.Module) -> bool:
    """Whether `module` holds experts in 3-D parameters (gate_up_proj, up_proj or
    down_proj), in whatever layout."""
    return any(p is not None and p.dim() == 3 and name in ("gate_up_proj", "up_proj", "down_proj")
               for name, p in module._parameters.items())


def fused_shapes(module: nn.Module):
    """(E, H, I) when `module` is fused experts that UnfusedExperts can stand in
    for: transformers' standard layout (gate_up_proj [E, 2I, H] concatenated, gate
    first; down_proj [E, H, I]; no biases, not transposed, no norm after each
    expert, the default gate act_fn(gate) * up); else None."""
    params = module._parameters
    gate_up, down = params.get("gate_up_proj"), params.get("down_proj")
    if gate_up is None or down is None or gate_up.dim() != 3 or down.dim() != 3:
        return None
    E, two_i, H = gate_up.shape
    if tuple(down.shape) != (E, H, two_i // 2) or two_i % 2 or not isinstance(
            getattr(module, "act_fn", None), nn.Module):
        return None
    flags = {"has_gate": True, "has_bias": False, "is_transposed": False,
             "is_concatenated": True, "has_post_expert_norm": False}
    if any(getattr(module, flag, default) != default for flag, default in flags.items()):
        return None
    if any(name.endswith("_bias") for name in params):
        return None
    apply_gate = getattr(type(module), "_apply_gate", None)
    if apply_gate is not None and getattr(apply_gate, "__name__", "") != "_default_apply_gate":
        return None  # a gate of its own (clamped, interleaved, ...)
    return E, H, two_i // 2


def find_fused(model: nn.Module) -> dict:
    """name -> (module, (E, H, I)) for every fused experts module of `model`."""
    found = {}
    for name, module in model.named_modules():
        shapes = fused_shapes(module)
        if shapes is not None:
            found[name] = (module, shapes)
    return found


def expert_names(model: nn.Module) -> tuple[str, str, str]:
    """The names a checkpoint gives each expert's gate, up and down projections
    (``experts.<e>.<name>.weight``): those of transformers' conversion that
    merges them into gate_up_proj and down_proj for this model (w1, w3, w2 for
    Mixtral; gate_proj, up_proj, down_proj for Qwen2-MoE and DeepSeek), else
    DEFAULT_NAMES."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter
    except ImportError:  # no transformers, or one without conversions (before 5)
        return DEFAULT_NAMES
    if not hasattr(model, "config"):
        return DEFAULT_NAMES  # not a transformers model
    transforms = get_model_conversion_mapping(model)
    source = re.compile(r"experts\.\*\.(\w+)\.weight$")
    gate_up = down = None
    for t in transforms:
        if not isinstance(t, WeightConverter):
            continue
        sources = getattr(t, "_original_source_patterns", t.source_patterns)
        targets = getattr(t, "_original_target_patterns", t.target_patterns)
        names = [m.group(1) for m in map(source.search, sources) if m]
        if len(targets) != 1 or len(names) != len(sources):
            continue
        ops = [type(op).__name__ for op in t.operations]
        if targets[0].endswith("experts.gate_up_proj") and len(names) == 2 \
                and ops == ["MergeModulelist", "Concatenate"] and t.operations[1].dim == 1:
            gate_up = gate_up or tuple(names)
        elif targets[0].endswith("experts.down_proj") and len(names) == 1 \
                and ops == ["MergeModulelist"]:
            down = down or names[0]
    if gate_up is None or down is None:
        return DEFAULT_NAMES
    return (*gate_up, down)


def unfuse(module: nn.Module, names, *, meta: bool = False) -> UnfusedExperts:
    """An UnfusedExperts computing what the fused experts `module` computes, in its
    train/eval mode, with nn.Linear projections whose weights are views of its
    own (no copy; own_weights() gives them memory of their own), or empty ones on
    the meta device (meta=True)."""
    E, H, I = fused_shapes(module)
    gate_up, down = module.gate_up_proj, module.down_proj
    experts = []
    for e in range(E):
        layers = [nn.Linear(H, I, bias=False, device="meta", dtype=gate_up.dtype),
                  nn.Linear(H, I, bias=False, device="meta", dtype=gate_up.dtype),
                  nn.Linear(I, H, bias=False, device="meta", dtype=down.dtype)]
        if not meta:
            for layer, w, source in zip(layers, (gate_up[e, :I], gate_up[e, I:], down[e]),
                                        (gate_up, gate_up, down)):
                layer.weight = nn.Parameter(w.detach(), requires_grad=source.requires_grad)
        expert = nn.Module()
        for name, layer in zip(names, layers):
            expert.add_module(name, layer)
        experts.append(expert)
    return UnfusedExperts(experts, names, module.act_fn).train(module.training)


def own_weights(experts: UnfusedExperts) -> None:
    """Gives every nn.Linear projection of `experts` a copy of its weight, so that
    none is a view of the fused module's tensors any more (which can then be freed,
    and which safetensors would refuse to save as tensors sharing memory)."""
    for module in experts.modules():
        if type(module) is nn.Linear:
            w = module.weight
            module.weight = nn.Parameter(w.detach().clone(), requires_grad=w.requires_grad)
