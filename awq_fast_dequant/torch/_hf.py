"""load_pretrained: a Hugging Face AWQ checkpoint -> a transformers model with AWQLinear layers.

The steps, in order, so that every error comes before the first byte is
allocated on the target device:

0. A Hugging Face Hub repository id, rather than a folder, is downloaded into
   huggingface_hub's cache: its configuration files first, checked as in step 1
   (a checkpoint that cannot be run is refused before its weights download),
   then its .safetensors files.
1. awq_fast_dequant.checkpoint validates the folder: the quantization_config
   (4 bits, zero point, the "gemm" version), the shards and their index, and
   every quantized layer's dtypes and shapes against the group size.
2. transformers builds the model from config.json, in the target dtype, with
   its parameters on the meta device (buffers are built as the model's code
   builds them: they are small, and some, like rotary frequencies, are
   computed there and are not in the checkpoint).
3. The checkpoint's tensors take the names transformers' from_pretrained gives
   them (its renamings for the model), fused experts that the checkpoint holds
   one by one become an UnfusedExperts (still on meta), each module the
   checkpoint quantizes becomes an AWQLinear (still on meta),
   each activation it scales (AutoAWQ's <activation>.scales) a
   ScaledActivation, and every parameter and persistent buffer of the model is
   matched to a checkpoint tensor of the same shape and kind of dtype; a
   missing one is an error. generation_config.json, when the model has a use
   for it, is read here.
4. Tensors are read one at a time through safetensors (memory-mapped, straight
   to the device) and put in place of the meta tensors.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import logging
import os
import re
import sys
import threading
from pathlib import Path

import torch
from torch import nn

import awq_fast_dequant as _afd
from awq_fast_dequant.checkpoint import (
    AUTOAWQ_CONFIG_NAME,
    CONFIG_NAME,
    INDEX_NAME,
    CheckpointFileError,
    TensorReader,
    check_folder_config,
    format_nbytes,
    open_checkpoint,
    shard_names,
)

from . import _experts
from ._module import AWQLinear, _int32_words, _scale_dtype
from ._siblings import fuse_projections

__all__ = ["load_pretrained"]

logger = logging.getLogger("awq_fast_dequant")


def _require(name: str):
    try:
        return __import__(name)
    except ImportError:
        raise ImportError(
            f"load_pretrained needs the {name} package: pip install 'awq_fast_dequant[hf]'"
        ) from None


# --- parameters on the meta device --------------------------------------------

# The building thread's flag; other threads building modules at the same time are not affected.
_meta_state = threading.local()
_patch_lock = threading.Lock()
_patch_users = 0
# What parameters_on_meta replaced when it was entered: torch's own function, or
# another library's patch of it (accelerate's init_empty_weights, say), which
# keeps working inside.
_wrapped_register_parameter = nn.Module.register_parameter


def _register_parameter(self, name, param):
    _wrapped_register_parameter(self, name, param)
    if param is not None and getattr(_meta_state, "active", False) and not param.is_meta:
        # Creation ran on the CPU (torch.empty: no page touched); the model keeps only the meta twin.
        self._parameters[name] = nn.Parameter(param.detach().to("meta"),
                                              requires_grad=param.requires_grad)


@contextlib.contextmanager
def parameters_on_meta():
    """Inside, in this thread, every nn.Parameter a module registers is moved to
    the meta device, so that building a model allocates no weights; buffers
    stay where the model's code puts them."""
    global _patch_users, _wrapped_register_parameter
    with _patch_lock:
        if _patch_users == 0 and nn.Module.register_parameter is not _register_parameter:
            _wrapped_register_parameter = nn.Module.register_parameter
            nn.Module.register_parameter = _register_parameter
        _patch_users += 1
    previous = getattr(_meta_state, "active", False)
    _meta_state.active = True
    try:
        yield
    finally:
        _meta_state.active = previous
        with _patch_lock:
            _patch_users -= 1
            # a patch installed after this one and still in place is left alone
            if _patch_users == 0 and nn.Module.register_parameter is _register_parameter:
                nn.Module.register_parameter = _wrapped_register_parameter


# --- arguments ----------------------------------------------------------------

def _target_device(device) -> torch.device:
    if device is None:
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must name a torch device ('cpu', 'cuda', 'cuda:1'); "
                         f"got {device!r}") from None
    if dev.type == "cpu":
        return dev
    if dev.type != "cuda":
        raise ValueError(f"device must be the CPU or a CUDA device; got {dev}")
    if not _afd.cuda_available():
        raise RuntimeError(
            f"device {dev} asked for, but this build of awq_fast_dequant has no usable CUDA "
            "backend (build_info() says what was compiled; rebuild where nvcc is found)")
    if not torch.cuda.is_available():
        raise RuntimeError(f"device {dev} asked for, but torch sees no CUDA device")
    index = torch.cuda.current_device() if dev.index is None else dev.index
    if index >= torch.cuda.device_count():
        raise ValueError(f"device {dev}: there are {torch.cuda.device_count()} CUDA devices")
    return torch.device("cuda", index)


def _target_dtype(dtype, checkpoint) -> torch.dtype:
    if dtype is not None:
        return _scale_dtype(dtype)
    found = sorted({layer.scales_dtype for layer in checkpoint.layers})
    if len(found) > 1:
        raise ValueError(f"the checkpoint's scales have several dtypes ({', '.join(found)}); "
                         "pass dtype=")
    return _scale_dtype(found[0])


def _model_class(transformers, config, model_class):
    if model_class is not None:
        return model_class
    for name in getattr(config, "architectures", None) or ():
        cls = getattr(transformers, name, None)
        if cls is not None:
            return cls
    raise ValueError(
        f"config.json names no architecture that transformers {transformers.__version__} has "
        f"(architectures: {getattr(config, 'architectures', None)}); pass model_class=, e.g. "
        "transformers.AutoModelForCausalLM")


def _build(model_class, config, dtype):
    """The model with every parameter on the meta device, built in `dtype` (so that
    the floating-point buffers the model computes itself are as from_pretrained
    makes them)."""
    quantization_config = getattr(config, "quantization_config", None)
    if quantization_config is not None:
        # The AWQ layers are put in here; transformers must not set up its own quantizer.
        del config.quantization_config
    try:
        with parameters_on_meta():
            if hasattr(model_class, "_from_config"):
                return model_class._from_config(config, dtype=dtype)
            return model_class.from_config(config, dtype=dtype)  # the Auto classes
    finally:
        if quantization_config is not None:
            config.quantization_config = quantization_config


# --- the names the model gives the checkpoint's tensors -------------------------

def _renamings(model) -> list:
    """transformers' renamings of checkpoint tensor names for `model`, in the order its
    from_pretrained applies them (transformers 5's conversion mapping, e.g. Mixtral's
    block_sparse_moe -> mlp, GPT-NeoX's embed_out -> lm_head, LayerNorm.gamma ->
    LayerNorm.weight; its save_pretrained writes the old names back); none where
    transformers has no such mapping."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightRenaming
    except ImportError:
        return []
    return [t for t in get_model_conversion_mapping(model) if isinstance(t, WeightRenaming)]


def _renamed(checkpoint, renamings, cls: str):
    """checkpoint with its tensors under the names the model gives them: the tensors
    and quantized layers renamed, each TensorInfo keeping its name in the file."""
    if not renamings:
        return checkpoint

    def rename(name: str) -> str:
        for t in renamings:
            name, _ = t.rename_source_key(name)
        return name

    tensors, new_name = {}, {}
    for name, info in checkpoint.tensors.items():
        new = rename(name)
        if new in tensors:
            raise ValueError(f"the checkpoint holds {tensors[new].stored or new!r} and "
                             f"{name!r}, which transformers' names for {cls} both make {new!r}")
        tensors[new] = info if new == name else dataclasses.replace(info, name=new, stored=name)
        new_name[name] = new
    if all(new_name[name] == name for name in new_name):
        return checkpoint
    layers = []
    for layer in checkpoint.layers:
        renamed = [tensors[new_name[t.name]] for t in layer.tensors]
        prefix = renamed[0].name[: -len(".qweight")]
        if [t.name for t in renamed] != [f"{prefix}.{leaf}" for leaf in
                                         ("qweight", "qzeros", "scales")]:
            raise ValueError(f"transformers' names for {cls} part the tensors of the "
                             f"checkpoint's layer {layer.prefix!r}: "
                             f"{', '.join(t.name for t in renamed)}")
        layers.append(dataclasses.replace(layer, prefix=prefix, qweight=renamed[0],
                                          qzeros=renamed[1], scales=renamed[2]))
    return dataclasses.replace(checkpoint, tensors=tensors, layers=tuple(layers),
                               others=tuple(tensors[new_name[t.name]] for t in checkpoint.others))


def _unfuse_experts(model, checkpoint, prefix: str) -> None:
    """Puts an UnfusedExperts (on meta) in place of each of the model's fused experts
    modules whose experts the checkpoint holds one by one (``<experts>.0.<gate>.qweight``
    or ``.weight``), as AWQ checkpoints of mixture-of-experts models do."""
    fused = _experts.find_fused(model)
    if not fused:
        return
    names = _experts.expert_names(model)
    for path, (module, _) in fused.items():
        probes = (f"{path}.0.{names[0]}.qweight", f"{path}.0.{names[0]}.weight")
        if any(_checkpoint_name(n, checkpoint.tensors, prefix) for n in probes):
            parent, _, child = path.rpartition(".")
            setattr(model.get_submodule(parent), child,
                    _experts.unfuse(module, names, meta=True))


# --- matching the model to the checkpoint -------------------------------------

def _checkpoint_name(name: str, tensors: dict, prefix: str):
    """The checkpoint's name for the model's tensor `name`, allowing for a
    checkpoint saved from the base model (no prefix) or from a model with a
    head (prefix), as transformers does."""
    if name in tensors:
        return name
    if prefix:
        if name.startswith(prefix + ".") and name[len(prefix) + 1:] in tensors:
            return name[len(prefix) + 1:]
        if f"{prefix}.{name}" in tensors:
            return f"{prefix}.{name}"
    return None


def _model_name(ckpt_name: str, model_names, prefix: str):
    """The inverse of _checkpoint_name, for a layer prefix of the checkpoint."""
    if ckpt_name in model_names:
        return ckpt_name
    if prefix:
        if f"{prefix}.{ckpt_name}" in model_names:
            return f"{prefix}.{ckpt_name}"
        if ckpt_name.startswith(prefix + ".") and ckpt_name[len(prefix) + 1:] in model_names:
            return ckpt_name[len(prefix) + 1:]
    return None


def _in_a_head(ckpt_name: str, checkpoint, prefix: str) -> bool:
    """Whether the checkpoint tensor or module `ckpt_name` lies outside the body of a
    checkpoint saved from a model with a head, which names its body's tensors under the
    base model's prefix: a model without one (the base model class) has no place for
    it. Such layers and activations are left out, as the head's dense tensors are, and
    _plan reports their tensors as unread; one inside the body that the model lacks
    means config.json does not describe the checkpoint."""
    return (bool(prefix) and not ckpt_name.startswith(prefix + ".")
            and any(n.startswith(prefix + ".") for n in checkpoint.tensors))


def _install_awq_layers(model, checkpoint, dtype, prefix: str) -> None:
    modules = dict(model.named_modules())
    for layer in checkpoint.layers:
        name = _model_name(layer.prefix, modules, prefix)
        module = modules.get(name) if name is not None else None
        if module is None:
            if _in_a_head(layer.prefix, checkpoint, prefix):
                continue
            raise ValueError(
                f"the checkpoint quantizes layer {layer.prefix!r}, which {type(model).__name__} "
                "does not have (is config.json the checkpoint's own?)")
        if not isinstance(module, nn.Linear):
            raise ValueError(f"the checkpoint quantizes {layer.prefix!r}, but the model's "
                             f"{name} is a {type(module).__name__}, not an nn.Linear")
        if (module.in_features, module.out_features) != (layer.in_features, layer.out_features):
            raise ValueError(
                f"layer {layer.prefix!r}: the checkpoint's qweight is [K={layer.in_features}, "
                f"N/8={layer.out_features // 8}] but the model's nn.Linear has in_features="
                f"{module.in_features}, out_features={module.out_features}")
        awq = AWQLinear(layer.in_features, layer.out_features, layer.group_size,
                        bias=module.bias is not None, dtype=dtype, device="meta")
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, awq)


class ScaledActivation(nn.Module):
    """An activation whose output is divided by per-channel scales.

    AutoAWQ scales the inputs of the layer after an MLP's activation by
    folding the scales into that layer's weights, and, for models whose
    layer before the activation cannot take them (GPT-J, Falcon, MPT, BLOOM,
    GPT-BigCode, StarCoder2, GPT-NeoX), keeps them in the checkpoint as
    <activation>.scales, to be divided out here. `act` is the model's own
    activation module."""

    def __init__(self, act: nn.Module, features: int, *, dtype=None, device=None):
        super().__init__()
        self.act = act
        self.scales = nn.Parameter(torch.ones(features, dtype=dtype, device=device))

    def forward(self, x):
        return self.act(x) / self.scales

    def extra_repr(self) -> str:
        return f"features={self.scales.shape[0]}"


def _install_scaled_activations(model, checkpoint, prefix: str) -> None:
    """Wraps in a ScaledActivation each activation module for which the checkpoint
    holds a lone P.scales (Checkpoint.activation_scales). Dropping those scales
    would leave every output of the MLP wrong, so a P.scales the model has no
    activation for is refused."""
    modules = dict(model.named_modules(remove_duplicate=False))
    cls = type(model).__name__
    for info in checkpoint.activation_scales:
        source, owner = info.name, info.name[: -len(".scales")]
        name = _model_name(owner, modules, prefix)
        module = modules.get(name) if name is not None else None
        if module is None:
            if _in_a_head(owner, checkpoint, prefix):
                continue
            raise ValueError(
                f"the checkpoint holds {source!r}, the scales of a scaled activation as "
                f"AutoAWQ writes them, but {cls} has no module {owner!r} to divide them out "
                "of (is config.json the checkpoint's own, and does transformers implement "
                "this activation as a module?)")
        if "scales" in module._parameters or "scales" in module._buffers:
            continue  # the model's own tensor
        if next(module.parameters(), None) is not None or next(module.buffers(), None) is not None:
            raise ValueError(
                f"the checkpoint holds {source!r}, the scales of a scaled activation as "
                f"AutoAWQ writes them, but {cls}'s {name} is a {type(module).__name__} with "
                "tensors of its own, not an activation")
        shape = list(info.shape)
        if len(shape) != 1:
            raise ValueError(f"{source} has shape {shape}; the scales of an activation are "
                             "one value per channel")
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child,
                ScaledActivation(module, shape[0], device="meta"))


def _slots(model):
    """name -> (module, attribute, is_parameter) for every parameter and
    persistent buffer, and the groups of names that hold one tensor (tied weights)."""
    slots, holders = {}, {}
    for mod_name, module in model.named_modules(remove_duplicate=False):
        dot = mod_name + "." if mod_name else ""
        for attr, p in module._parameters.items():
            if p is not None:
                slots[dot + attr] = (module, attr, True)
                holders.setdefault(id(p), []).append(dot + attr)
        for attr, b in module._buffers.items():
            if b is not None and attr not in module._non_persistent_buffers_set:
                slots[dot + attr] = (module, attr, False)
                holders.setdefault(id(b), []).append(dot + attr)
    return slots, holders


def _dtype_kind(dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "boolean"
    if dtype.is_complex:
        return "complex"
    return "floating-point" if dtype.is_floating_point else "integer"


def _code_kind(code: str) -> str:
    """_dtype_kind for a safetensors dtype code ("F16", "BF16", "F8_E4M3", "I32", ...)."""
    if code == "BOOL":
        return "boolean"
    if code.startswith("C"):
        return "complex"
    return "floating-point" if code.startswith(("F", "BF")) else "integer"


def _same_bytes(folder: Path, a, b) -> bool:
    """Whether the checkpoint tensors a and b (TensorInfo) hold the same dtype, shape and
    bytes. The files are compared a chunk at a time, so that no tensor is allocated."""
    if (a.dtype, tuple(a.shape)) != (b.dtype, tuple(b.shape)):
        return False
    chunk = 1 << 24
    with open(Path(folder) / a.file, "rb") as fa, open(Path(folder) / b.file, "rb") as fb:
        fa.seek(a.offset)
        fb.seek(b.offset)
        left = a.nbytes
        while left:
            n = min(chunk, left)
            if fa.read(n) != fb.read(n):
                return False
            left -= n
    return True


def _too_many(items, sep: str = "; ") -> str:
    return sep.join(items[:5]) + (f" and {len(items) - 5} more" if len(items) > 5 else "")


def _plan(model, checkpoint, prefix: str):
    """[(checkpoint name, [model names])], after checking names, shapes and dtypes."""
    tensors = checkpoint.tensors
    cls = type(model).__name__
    slots, holders = _slots(model)
    groups, missing, wrong, kinds = [], [], [], []
    for names in holders.values():
        found = {n: _checkpoint_name(n, tensors, prefix) for n in names}
        sources = list(dict.fromkeys(s for s in found.values() if s))
        module, attr, is_parameter = slots[names[0]]
        current = getattr(module, attr)
        if not sources:
            if current.is_meta:
                missing.append(names[0])
            continue  # a buffer the model built, which the checkpoint leaves out
        # Every tensor that may be read into this slot is checked, also a tied twin.
        for source in sources:
            info = tensors[source]
            if tuple(info.shape) != tuple(current.shape):
                wrong.append(f"{source}: checkpoint {list(info.shape)}, "
                             f"model {list(current.shape)}")
            kind = _dtype_kind(current.dtype)
            if _code_kind(info.dtype) != kind:
                # _load converts only between floating-point dtypes; any other mismatch is
                # refused here, before a tensor is read.
                a = "an" if kind[0] in "aeiou" else "a"
                kinds.append(f"{source} is {info.dtype}, but {cls}'s {names[0]} is {a} {kind} "
                             f"{'parameter' if is_parameter else 'buffer'} ({current.dtype}), "
                             f"which needs {a} {kind} tensor")
        groups.append((names, found, sources))
    if missing:
        raise ValueError(f"the checkpoint has no tensor for {_too_many(missing, ', ')}, "
                         f"which {cls} needs")
    if wrong:
        raise ValueError(f"tensor shapes disagree with the model: {_too_many(wrong)}")
    if kinds:
        raise ValueError(f"tensor dtypes disagree with the model: {_too_many(kinds)}")

    plan, used = [], set()
    for names, found, sources in groups:
        if len(sources) == 1 or all(_same_bytes(checkpoint.folder, tensors[sources[0]],
                                                 tensors[s]) for s in sources[1:]):
            # A tied tensor is read once, under the first of its names the checkpoint holds;
            # the other copies hold the same values.
            plan.append((sources[0], names))
            used.update(sources)
            continue
        # The model ties tensors that the checkpoint holds with different values: config.json
        # ties what the weights do not (tie_word_embeddings). As transformers does, each slot
        # gets its own tensor; a name the checkpoint lacks stays with the first one found.
        by_slot = {}
        for n in names:
            module, attr, _ = slots[n]
            by_slot.setdefault((id(module), attr), []).append(n)
        by_source = {}
        for slot_names in by_slot.values():
            source = next((found[n] for n in slot_names if found[n]), sources[0])
            by_source.setdefault(source, []).extend(slot_names)
        if len(by_source) > 1:
            logger.warning(
                "load_pretrained: %s ties %s, but the checkpoint holds them with different "
                "values; each is read from its own tensor, untied (does config.json's "
                "tie_word_embeddings describe this checkpoint?)",
                cls, " and ".join(by_source))
            _untie(model, names)
        plan.extend(by_source.items())
        used.update(by_source)
    unused = sorted(set(tensors) - used)
    if unused:
        logger.warning("load_pretrained: %d checkpoint tensors have no place in %s and are not "
                       "read: %s%s", len(unused), type(model).__name__, ", ".join(unused[:5]),
                       " ..." if len(unused) > 5 else "")
    return plan, slots


def _untie(model, names) -> None:
    """Drops the pairs among `names` from transformers' record of the model's tied
    weights (all_tied_weights_keys), so that its own re-tying (init_weights) leaves
    them apart, as its from_pretrained does when it finds them different in a checkpoint."""
    tied = getattr(model, "all_tied_weights_keys", None)
    if isinstance(tied, dict):
        for target in [t for t, s in tied.items() if t in names and s in names]:
            del tied[target]


# --- reading ------------------------------------------------------------------

class _Progress:
    """load_pretrained's progress on stderr, over the bytes read: a tqdm bar when
    tqdm is installed, else a line each time another tenth of them is read;
    nothing when not enabled."""

    def __init__(self, enabled: bool, total: int, tensors: int):
        self.enabled, self.total, self.tensors = bool(enabled), total, tensors
        self.done = self.count = self.tenths = 0
        self.bar = None
        if self.enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self.bar = tqdm(total=total, desc="load_pretrained", unit="B", unit_scale=True,
                            unit_divisor=1000, dynamic_ncols=True, file=sys.stderr)

    def step(self, nbytes: int) -> None:
        self.done += nbytes
        self.count += 1
        if self.bar is not None:
            self.bar.update(nbytes)
            return
        percent = 100 * self.done // self.total if self.total else 100
        if self.enabled and (percent // 10 > self.tenths or self.count == self.tensors):
            self.tenths = percent // 10
            print(f"load_pretrained {percent}% "
                  f"({format_nbytes(self.done)} of {format_nbytes(self.total)}, "
                  f"{self.count}/{self.tensors} tensors)", file=sys.stderr, flush=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()


def _kept_in_float32(model, dtype):
    """A pattern for the names of the tensors that transformers' from_pretrained keeps in
    float32 whatever dtype it loads the model in (the model's _keep_in_fp32_modules
    under float16, _keep_in_fp32_modules_strict under float16 and bfloat16: routers'
    score corrections, for one); None where there are none."""
    names = set()
    if dtype == torch.float16:
        names.update(getattr(model, "_keep_in_fp32_modules", None) or ())
    if dtype in (torch.float16, torch.bfloat16):
        names.update(getattr(model, "_keep_in_fp32_modules_strict", None) or ())
    if not names:
        return None
    return re.compile("|".join(n.replace(".", r"\.").replace("*", ".*") for n in sorted(names)))


def _load(model, checkpoint, plan, slots, dtype, device, progress) -> None:
    where = "cpu" if device.type == "cpu" else f"cuda:{device.index}"
    info = checkpoint.tensors
    float32 = _kept_in_float32(model, dtype)
    total = sum(info[source].nbytes for source, _ in plan)
    with TensorReader(checkpoint.folder, info, "pt", device=where) as reader, \
            _Progress(progress, total, len(plan)) as bar:
        for source, names in plan:
            t = reader.get(source)
            bar.step(info[source].nbytes)
            module, attr, is_parameter = slots[names[0]]
            t = _int32_words(t)  # AWQ words stored as uint32: the same bits
            if t.is_floating_point():
                # The dtype the model built the tensor in (dtype but where its code chose
                # another), or float32 where transformers keeps it so; AWQ layers keep
                # their scales in dtype.
                want = getattr(module, attr).dtype
                if (float32 is not None and not isinstance(module, AWQLinear)
                        and any(float32.search(n) for n in names)):
                    want = torch.float32
                if t.dtype != want:
                    t = t.to(want)
            if is_parameter:
                t = nn.Parameter(t, requires_grad=getattr(module, attr).requires_grad)
            for name in names:
                module, attr, _ = slots[name]
                (module._parameters if is_parameter else module._buffers)[attr] = t
    _buffers_to(model, device)


def _buffers_to(model, device) -> None:
    """What the model built itself (its buffers) joins the weights on the device; a
    tensor that several modules hold is moved once, and stays one tensor."""
    moved: dict = {}  # id -> (the tensor, its copy on the device)
    for module in model.modules():
        for attr, b in module._buffers.items():
            if b is not None and b.device != device:
                if id(b) not in moved:
                    moved[id(b)] = b, b.to(device)
                module._buffers[attr] = moved[id(b)][1]


# --- a checkpoint on the Hugging Face Hub ---------------------------------------------

# A Hub repository id: "owner/name", each part letters, digits, '-', '_' or '.'.
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")
# What load_pretrained reads of a repository, the small files first.
_HUB_CONFIG_FILES = (CONFIG_NAME, AUTOAWQ_CONFIG_NAME, "generation_config.json", INDEX_NAME)


def _checkpoint_path(path, revision):
    """path itself when it names a local file or folder (or cannot name a Hub repository);
    else the folder huggingface_hub downloads the repository `path` into (its cache, shared
    with transformers): the configuration files first, checked, so that a checkpoint this
    package cannot run is refused before its weights are downloaded, then the .safetensors
    files the checkpoint is made of (the shards its index lists, else model.safetensors).
    Nothing is downloaded that the cache already holds."""
    local = isinstance(path, (str, os.PathLike)) and Path(path).exists()
    if local or not (isinstance(path, str) and _REPO_ID.fullmatch(path)):
        if revision is not None:
            raise ValueError(f"revision is for a Hugging Face Hub repository id; {path!r} is "
                             + ("a local path" if local else "not one ('owner/name')"))
        return path
    hub = _require("huggingface_hub")

    def fetch(patterns):
        try:
            return Path(hub.snapshot_download(path, revision=revision,
                                              allow_patterns=list(patterns)))
        except (OSError, ValueError) as e:  # not found, gated, offline and not cached, no network
            raise CheckpointFileError(
                f"{path}: no such file or folder, and no checkpoint of that name could be "
                f"downloaded from the Hugging Face Hub ({type(e).__name__}: {e})") from e

    configs = fetch(_HUB_CONFIG_FILES)
    check_folder_config(configs)
    return fetch(_HUB_CONFIG_FILES + tuple(glob.escape(f) for f in shard_names(configs)))


def load_pretrained(path, *, dtype=None, device=None, model_class=None, progress=False,
                    revision=None, fuse=True):
    """Load a Hugging Face AWQ checkpoint folder into its transformers model,
    with an AWQLinear for every layer the checkpoint quantizes.

    path: a folder with config.json (quantization_config: quant_method "awq",
        bits 4, zero_point true, version "gemm") and model.safetensors, or
        shards listed in model.safetensors.index.json; or, where no such
        folder exists, the id of such a repository on the Hugging Face Hub
        ("owner/name"), downloaded with huggingface_hub into its cache (its
        configuration first: a checkpoint that cannot be run is refused before
        its weights are downloaded).
    dtype: of scales, bias and every other floating-point tensor the
        checkpoint holds; default the scales' dtype.
    device: where the model goes ("cpu", "cuda", "cuda:1"); default the CPU.
    model_class: the transformers class to build (e.g.
        transformers.AutoModelForCausalLM); default the first of
        config.json's architectures.
    progress: show on stderr the bytes read so far (a tqdm bar when tqdm is
        installed, else a line each tenth). A download shows huggingface_hub's
        own progress bars, whatever this says.
    revision: the branch, tag or commit of a Hub repository; default its main
        branch.
    fuse: run fuse_projections on the loaded model (its dummy_inputs show which
        AWQ layers take the same input): attention's query, key and value
        projections, and a gated MLP's gate and up projections, each computed by
        one call. A model that cannot run its dummy_inputs is left unfused, with
        a warning.

    Returns the model in eval mode, ready for generate(). Checkpoints this
    package cannot run raise ValueError (awq_fast_dequant.checkpoint's
    CheckpointError for the checkpoint itself) before anything is allocated on
    the device. Needs transformers and safetensors (the 'hf' extra).
    """
    transformers = _require("transformers")
    major = transformers.__version__.split(".")[0]
    if not major.isdigit() or int(major) < 5:
        # transformers 4 keeps other module layouts and lacks the tied-weights and
        # weight-renaming interfaces this loader reads
        raise ImportError(f"load_pretrained needs transformers 5 or later; this is "
                          f"transformers {transformers.__version__} "
                          f"(pip install 'transformers>=5')")
    _require("safetensors")
    device = _target_device(device)  # the arguments first: a download may take long
    if dtype is not None:
        dtype = _scale_dtype(dtype)
    checkpoint = open_checkpoint(_checkpoint_path(path, revision))
    if checkpoint.config is None:
        raise ValueError(f"{path}: load_pretrained needs a checkpoint folder with config.json")
    dtype = _target_dtype(dtype, checkpoint)

    config = transformers.AutoConfig.from_pretrained(str(checkpoint.folder))
    cls = _model_class(transformers, config, model_class)
    model = _build(cls, config, dtype)
    prefix = getattr(model, "base_model_prefix", "") or ""
    checkpoint = _renamed(checkpoint, _renamings(model), type(model).__name__)
    _unfuse_experts(model, checkpoint, prefix)
    _install_awq_layers(model, checkpoint, dtype, prefix)
    _install_scaled_activations(model, checkpoint, prefix)
    plan, slots = _plan(model, checkpoint, prefix)
    generation = Path(checkpoint.folder) / "generation_config.json"
    if generation.is_file() and hasattr(model, "generation_config"):
        try:
            model.generation_config = transformers.GenerationConfig.from_pretrained(
                str(checkpoint.folder))
        except (OSError, ValueError, TypeError) as e:  # not JSON, or fields of the wrong type
            raise CheckpointFileError(f"{generation}: transformers cannot read it as a "
                                      f"generation config ({type(e).__name__}: {e})") from e

    _load(model, checkpoint, plan, slots, dtype, device, progress)
    if hasattr(model.config, "dtype"):
        model.config.dtype = dtype
    if getattr(model.config, "quantization_config", None) is None:
        # A checkpoint described by AutoAWQ's quant_config.json alone: the model's own
        # save_pretrained then writes the quantization_config that load_pretrained reads.
        model.config.quantization_config = checkpoint.quant.to_dict()
    model.eval()
    if fuse:
        _fuse(model)
    return model


def _fuse(model) -> None:
    if getattr(model, "dummy_inputs", None) is None:
        logger.info("load_pretrained: %s has no dummy_inputs; its layers are not fused",
                    type(model).__name__)
        return
    try:
        fuse_projections(model)
    except Exception as e:  # the model's own forward, on inputs it may not take
        logger.warning("load_pretrained: %s did not run its dummy_inputs (%s: %s); its AWQ "
                       "layers are not fused (fuse_projections(model, example) fuses them "
                       "given an input it takes)", type(model).__name__, type(e).__name__, e)
