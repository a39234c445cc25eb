"""Reading AWQ checkpoints: configuration, shards, quantized layers, lazy tensors.

A Hugging Face AWQ checkpoint is a folder holding config.json, whose
``quantization_config`` says ``quant_method: "awq"``, and its weights: one
``model.safetensors``, or shards listed in ``model.safetensors.index.json``.
A bare ``.safetensors`` file works too, given its group size (or one that its
shapes imply).

:func:`open_checkpoint` reads the configuration files and the safetensors
headers only, checks everything it can (format, bits, version, shards against
the index, every quantized layer's dtypes and shapes against the group size)
and returns a :class:`Checkpoint`, which opens tensors lazily (memory-mapped by
safetensors) one at a time. Every problem is a :class:`CheckpointError` (a
ValueError) raised there, before the caller has read a tensor or written
anything.

A quantized layer is a prefix P with three tensors, in the AWQ "GEMM" layout
(K = in_features, N = out_features, G = group size)::

    P.qweight  int32 (or uint32) [K, N/8]
    P.qzeros   int32 (or uint32) [K/G, N/8]
    P.scales   float16 | bfloat16 | float32 [K/G, N]

torch is never imported by this module.
"""

from __future__ import annotations

import contextlib
import json
import operator
import struct
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CheckpointError",
    "CheckpointFileError",
    "NotAWQCheckpointError",
    "UnsupportedCheckpointError",
    "LayerShapeError",
    "AWQConfig",
    "TensorInfo",
    "QuantizedLayer",
    "Checkpoint",
    "TensorReader",
    "open_checkpoint",
    "open_safetensors",
    "check_folder_config",
    "shard_names",
    "DTYPE_SIZES",
]

CONFIG_NAME = "config.json"
SINGLE_FILE_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
# AutoAWQ writes its quantization settings to this file as well (older releases only there).
AUTOAWQ_CONFIG_NAME = "quant_config.json"

# Bytes per element of each safetensors dtype code that this package reads or
# copies. Sub-byte codes (F4, F6_*) are left out: no AWQ checkpoint holds them.
DTYPE_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4,
    "U64": 8, "I64": 8, "F64": 8, "C64": 8,
}
# The codes safetensors' NumPy reader can return; BF16 needs ml_dtypes imported.
_NUMPY_CODES = frozenset(DTYPE_SIZES) - {"F8_E5M2", "F8_E4M3", "F8_E8M0"}


def tensor_nbytes(dtype: str, shape) -> int:
    """Bytes of a tensor of safetensors dtype code `dtype` and `shape`."""
    n = DTYPE_SIZES[dtype]
    for d in shape:
        n *= d
    return n


def format_nbytes(nbytes: int) -> str:
    """A byte count for people: "1.68 MB", "4.52 GB", "800 bytes"."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes} bytes"


_WORD_CODES = ("I32", "U32")
_SCALE_CODES = ("F16", "BF16", "F32")
SCALE_DTYPE_NAMES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32"}

# Versions of AutoAWQ's formats, and why each is not the "GEMM" layout read here.
_OTHER_VERSIONS = {
    "gemv": "packs along K for matrix-vector kernels",
    "gemv_fast": "interleaves weights for matrix-vector kernels",
    "marlin": "is repacked into Marlin tiles, with symmetric quantization",
    "exllama": "is repacked for ExLlama kernels",
    "ipex": "is repacked for Intel Extension for PyTorch",
    "llm-awq": "is the original llm-awq packing, not AutoAWQ's GEMM one",
}


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or converted, with the reason."""


class CheckpointFileError(CheckpointError):
    """A file that is missing, unreadable or malformed."""


class NotAWQCheckpointError(CheckpointError):
    """A checkpoint that is not AWQ-quantized (or has no quantized layer)."""


class UnsupportedCheckpointError(CheckpointError):
    """An AWQ checkpoint in a variant this package does not read (bits, version, zero point)."""


class LayerShapeError(CheckpointError):
    """A quantized layer whose tensors disagree with each other or with the group size."""


def _safetensors():
    try:
        import safetensors
    except ImportError:
        raise ImportError(
            "reading checkpoints needs the safetensors package: "
            "pip install 'awq_fast_dequant[convert]' (or pip install safetensors)") from None
    return safetensors


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class AWQConfig:
    """The quantization settings of an AWQ checkpoint.

    group_size is -1 for one group per layer (G = K, per-channel scales).
    modules_to_not_convert lists the modules the checkpoint keeps dense; it is
    carried as data (those modules hold plain ``.weight`` tensors).
    """

    group_size: int
    bits: int = 4
    zero_point: bool = True
    version: str = "gemm"
    modules_to_not_convert: tuple[str, ...] | None = None

    @classmethod
    def from_dict(cls, config, source: str = "quantization_config") -> "AWQConfig":
        """Validate a quantization_config (or AutoAWQ quant_config.json) dict.

        Accepts Hugging Face's keys (bits, group_size) and AutoAWQ's (w_bit,
        q_group_size); version is case-insensitive. ``source`` names the dict in
        messages.
        """
        if not isinstance(config, dict):
            raise NotAWQCheckpointError(
                f"{source} must be a JSON object; got {type(config).__name__}")
        method = config.get("quant_method", "awq" if source.endswith(AUTOAWQ_CONFIG_NAME) else None)
        if not isinstance(method, str) or method.lower() != "awq":
            raise NotAWQCheckpointError(
                f"{source}: quant_method is {method!r}; expected 'awq' "
                "(only AWQ checkpoints can be read)")
        bits = config.get("bits", config.get("w_bit"))
        if bits is None:
            raise UnsupportedCheckpointError(f"{source}: no 'bits' (or 'w_bit'); expected bits: 4")
        if bits != 4:
            raise UnsupportedCheckpointError(
                f"{source}: bits is {bits!r}; only 4-bit AWQ checkpoints are supported")
        group_size = config.get("group_size", config.get("q_group_size"))
        if not _is_int(group_size) or (group_size < 1 and group_size != -1):
            raise UnsupportedCheckpointError(
                f"{source}: group_size must be a positive integer or -1 (per channel); "
                f"got {group_size!r}")
        # Hugging Face's AwqConfig defaults: zero_point true, version "gemm".
        zero_point = config.get("zero_point", True)
        if zero_point is not True:
            raise UnsupportedCheckpointError(
                f"{source}: zero_point is {zero_point!r}; only asymmetric AWQ (zero_point: true, "
                "with qzeros) is supported")
        # transformers 5 calls the layout "format" and reads the older "version"
        # first; its backend "llm-awq" stands for llm-awq's own layout.
        version, layout = config.get("version"), config.get("format")
        if version is None:
            version = "gemm" if layout is None else layout
        elif layout is not None and str(layout).lower() != str(version).lower():
            raise UnsupportedCheckpointError(
                f"{source}: version {version!r} and format {layout!r} disagree; "
                "they name the same thing (the packing of the weights)")
        if str(config.get("backend", "")).lower() == "llm-awq":
            version = "llm-awq"
        if not isinstance(version, str) or version.lower() != "gemm":
            why = _OTHER_VERSIONS.get(str(version).lower(), "is not the GEMM layout")
            raise UnsupportedCheckpointError(
                f"{source}: version {version!r} is not supported: only 'gemm' (the layout of "
                f"AutoAWQ's WQLinear_GEMM) is read; this format {why}")
        skip = config.get("modules_to_not_convert")
        if skip is not None:
            if not isinstance(skip, list) or not all(isinstance(m, str) for m in skip):
                raise UnsupportedCheckpointError(
                    f"{source}: modules_to_not_convert must be a list of names or null; "
                    f"got {skip!r}")
            skip = tuple(skip)
        return cls(group_size=group_size, bits=4, zero_point=True, version="gemm",
                   modules_to_not_convert=skip)

    def to_dict(self) -> dict:
        """The Hugging Face quantization_config form."""
        return {
            "quant_method": "awq", "bits": self.bits, "group_size": self.group_size,
            "zero_point": self.zero_point, "version": self.version,
            "modules_to_not_convert": (None if self.modules_to_not_convert is None
                                       else list(self.modules_to_not_convert)),
        }


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a checkpoint, as its safetensors header describes it."""

    name: str
    file: str          # the shard holding it, relative to Checkpoint.folder
    dtype: str         # safetensors code: "F16", "I32", ...
    shape: tuple[int, ...]
    offset: int = 0    # where its bytes start in the file
    stored: str = ""   # its name in the file, where `name` is another (a model's name for it)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.dtype, self.shape)


@dataclass(frozen=True)
class QuantizedLayer:
    """The three tensors of one AWQ linear layer, validated against each other."""

    prefix: str
    in_features: int    # K
    out_features: int   # N
    group_size: int     # G; equals K for a per-channel layer
    qweight: TensorInfo
    qzeros: TensorInfo
    scales: TensorInfo

    @property
    def weight_name(self) -> str:
        """The dense tensor's name: what nn.Linear calls it."""
        return self.prefix + ".weight"

    @property
    def file(self) -> str:
        """The shard the dense weight belongs to: the one holding qweight."""
        return self.qweight.file

    @property
    def scales_dtype(self) -> str:
        """'float16', 'bfloat16' or 'float32'."""
        return SCALE_DTYPE_NAMES[self.scales.dtype]

    @property
    def tensors(self) -> tuple[TensorInfo, TensorInfo, TensorInfo]:
        return (self.qweight, self.qzeros, self.scales)


@dataclass(frozen=True)
class Checkpoint:
    """A validated AWQ checkpoint; see open_checkpoint()."""

    path: Path                    # what was given: a folder or a .safetensors file
    folder: Path                  # the folder holding the shards
    files: tuple[str, ...]        # shard file names, in order
    sharded: bool                 # True when an index lists the files
    config: dict | None           # config.json (None for a bare file)
    quant: AWQConfig
    index: dict | None            # model.safetensors.index.json, as read
    tensors: dict                 # name -> TensorInfo, every tensor
    layers: tuple[QuantizedLayer, ...]
    others: tuple[TensorInfo, ...]  # the tensors that belong to no quantized layer
    file_metadata: dict           # shard -> its safetensors __metadata__ (or None)
    own_files: frozenset          # the names in folder this checkpoint is made of

    @property
    def activation_scales(self) -> tuple[TensorInfo, ...]:
        """The lone P.scales tensors (no P.qweight beside them): AutoAWQ's scaled
        activations, by which an activation's output is divided (the next layer's
        weights hold their product), in GPT-J, Falcon, MPT, BLOOM, GPT-BigCode,
        StarCoder2 and GPT-NeoX checkpoints."""
        return tuple(t for t in self.others if t.name.endswith(".scales"))

    def unreadable(self, framework: str, names=None) -> list[TensorInfo]:
        """The tensors (of `names`, default all) that safetensors cannot return
        in `framework` ("numpy" or "pt")."""
        if framework == "pt":
            return []
        infos = [self.tensors[n] for n in (self.tensors if names is None else names)]
        bad = [t for t in infos if t.dtype not in _NUMPY_CODES]
        if any(t.dtype == "BF16" for t in infos):
            try:
                import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy)
            except ImportError:
                bad += [t for t in infos if t.dtype == "BF16"]
        return bad

    def open_tensors(self, framework: str = "numpy", names=None) -> "TensorReader":
        """A reader of this checkpoint's tensors as NumPy arrays ("numpy") or
        torch CPU tensors ("pt"). Raises CheckpointError, before reading
        anything, when a tensor of `names` (default: all) cannot be held in
        that framework."""
        if framework not in ("numpy", "pt"):
            raise ValueError(f"framework must be 'numpy' or 'pt'; got {framework!r}")
        bad = self.unreadable(framework, names)
        if bad:
            names = ", ".join(f"{t.name} ({t.dtype})" for t in bad[:3])
            more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
            hint = ("bfloat16 in NumPy needs ml_dtypes: pip install ml_dtypes"
                    if all(t.dtype == "BF16" for t in bad)
                    else "read them with torch instead (framework 'pt', or --device cuda)")
            raise CheckpointError(
                f"NumPy cannot hold the dtype of {names}{more}; {hint}")
        return TensorReader(self.folder, self.tensors, framework)


class TensorReader:
    """Reads tensors one at a time; each file is opened (memory-mapped by
    safetensors) on first use and closed by close() or at the end of a with block.
    device (framework "pt" only): where safetensors puts the tensors, e.g.
    "cuda:1"; default the CPU."""

    def __init__(self, folder: Path, tensors: dict, framework: str = "numpy", device=None):
        self._folder = Path(folder)
        self._tensors = tensors
        self._framework = framework
        self._options = {} if device is None else {"device": device}
        self._handles: dict = {}
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> "TensorReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._handles.clear()
        self._stack.close()

    def get(self, name: str):
        """The tensor `name`: a NumPy array or a torch tensor (on the reader's
        device) of its shape."""
        info = self._tensors.get(name)
        if info is None:
            raise KeyError(f"no tensor named {name!r} in {self._folder}")
        handle = self._handles.get(info.file)
        if handle is None:
            path = self._folder / info.file
            handle = self._stack.enter_context(
                _safetensors().safe_open(str(path), framework=self._framework, **self._options))
            self._handles[info.file] = handle
        return handle.get_tensor(info.stored or info.name)


def _read_json(path: Path, what: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise CheckpointFileError(f"cannot read {what} {path}: {e.strerror or e}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointFileError(f"{what} {path} is not valid JSON: {e}") from None


def _data_offsets(path: Path) -> dict:
    """name -> offset of its first byte in the file, from a safetensors header
    that safe_open has already validated (8-byte length, JSON, then the data)."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    return {name: 8 + length + entry["data_offsets"][0]
            for name, entry in header.items() if name != "__metadata__"}


def _read_headers(folder: Path, files, index):
    """(tensors, metadata) from the safetensors headers of `files`, checked
    against the index when there is one."""
    safe_open = _safetensors().safe_open
    tensors, metadata = {}, {}
    for file in files:
        path = folder / file
        try:
            with safe_open(str(path), framework="numpy") as f:
                metadata[file] = f.metadata()
                offsets = _data_offsets(path)
                for name in f.keys():
                    view = f.get_slice(name)
                    info = TensorInfo(name, file, view.get_dtype(), tuple(view.get_shape()),
                                      offsets[name])
                    if name in tensors:
                        raise CheckpointFileError(
                            f"tensor {name!r} is stored twice: in {tensors[name].file} and {file}")
                    tensors[name] = info
        except CheckpointError:
            raise
        except Exception as e:  # safetensors raises its own error types, and OSError
            raise CheckpointFileError(f"{path} cannot be read as safetensors: {e}") from None
    for info in tensors.values():
        if info.dtype not in DTYPE_SIZES:
            raise CheckpointFileError(
                f"tensor {info.name!r} in {info.file} has dtype {info.dtype}, which this "
                f"package does not handle (known: {', '.join(sorted(DTYPE_SIZES))})")
    if index is not None:
        _check_index(index, tensors)
    return tensors, metadata


def _index_shards(folder: Path):
    """(shard file names, index) that the folder's index lists, the index checked for
    form; ((), None) without an index. Whether the shards are there is not checked."""
    index_path = folder / INDEX_NAME
    if not index_path.is_file():
        return (), None
    index = _read_json(index_path, "index")
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map or not all(
            isinstance(v, str) for v in weight_map.values()):
        raise CheckpointFileError(
            f"{index_path}: expected an object with a non-empty 'weight_map' of "
            "tensor name -> file name")
    files = tuple(dict.fromkeys(sorted(weight_map.values())))
    for file in files:
        if Path(file).name != file:
            raise CheckpointFileError(
                f"{index_path}: shard {file!r} is not a file name in the checkpoint folder")
    return files, index


def shard_names(folder) -> tuple:
    """The names of the files that hold the weights of the checkpoint folder `folder`:
    the shards its index lists, else model.safetensors. Only the index is read (and
    checked, raising CheckpointFileError as open_checkpoint does); the files need not
    be there yet."""
    return _index_shards(Path(folder))[0] or (SINGLE_FILE_NAME,)


def _find_shards(folder: Path):
    """(files, index) of a checkpoint folder."""
    files, index = _index_shards(folder)
    if index is not None:
        missing = [f for f in files if not (folder / f).is_file()]
        if missing:
            raise CheckpointFileError(
                f"{folder / INDEX_NAME} lists {len(files)} shards; missing from {folder}: "
                f"{', '.join(missing)}")
        return files, index
    if (folder / SINGLE_FILE_NAME).is_file():
        return (SINGLE_FILE_NAME,), None
    found = sorted(p.name for p in folder.iterdir() if p.name.endswith(".safetensors"))
    if found:
        hint = (f"found {', '.join(found[:4])}; pass the file itself as SRC"
                if len(found) == 1 else f"found {', '.join(found[:4])} but no {INDEX_NAME}")
    elif any(p.name.endswith(".bin") for p in folder.iterdir()):
        hint = "it holds .bin weights: only safetensors checkpoints can be read"
    else:
        hint = "it holds no .safetensors file"
    raise CheckpointFileError(f"no {SINGLE_FILE_NAME} or {INDEX_NAME} in {folder}: {hint}")


def _check_index(index: dict, tensors: dict) -> None:
    """The index must say where every tensor is, and nothing else."""
    weight_map = index["weight_map"]
    for name, file in weight_map.items():
        info = tensors.get(name)
        if info is None:
            raise CheckpointFileError(
                f"{INDEX_NAME} lists tensor {name!r} in {file}, which does not hold it")
        if info.file != file:
            raise CheckpointFileError(
                f"{INDEX_NAME} lists tensor {name!r} in {file}, but it is stored in {info.file}")
    unlisted = [n for n in tensors if n not in weight_map]
    if unlisted:
        raise CheckpointFileError(
            f"{INDEX_NAME} does not list {len(unlisted)} tensor(s) of the shards, e.g. "
            f"{unlisted[0]!r} in {tensors[unlisted[0]].file}")


def _shape(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _layer_prefixes(tensors: dict) -> list[str]:
    """Prefixes P with a P.qweight; P.qzeros without P.qweight is an error.
    A lone P.scales is an ordinary tensor (AutoAWQ's scaled activations have one)."""
    prefixes = sorted(n[: -len(".qweight")] for n in tensors if n.endswith(".qweight"))
    known = set(prefixes)
    for name in tensors:
        if name.endswith(".qzeros") and name[: -len(".qzeros")] not in known:
            raise LayerShapeError(f"{name} has no matching qweight tensor")
    return prefixes


def _infer_group_size(tensors: dict, prefixes) -> int:
    """The group size every layer's shapes imply (K / rows of scales), if they agree."""
    found = {}
    for p in prefixes:
        qweight, scales = tensors[p + ".qweight"], tensors.get(p + ".scales")
        if scales is None or len(qweight.shape) != 2 or len(scales.shape) != 2:
            continue  # reported by _check_layer
        K, rows = qweight.shape[0], scales.shape[0]
        if rows == 0 or K % rows:
            raise LayerShapeError(
                f"layer {p!r}: cannot infer the group size: qweight has {K} rows and scales "
                f"{rows}, which does not divide it; pass the group size")
        found.setdefault(K // rows, p)
    if len(found) > 1:
        sizes = ", ".join(f"{g} ({p})" for g, p in sorted(found.items()))
        raise CheckpointError(
            f"cannot infer one group size: the layers' shapes give {sizes}; pass the group size")
    return next(iter(found), -1)


def _check_layer(prefix: str, tensors: dict, group_size: int) -> QuantizedLayer:
    parts = {}
    for part in ("qweight", "qzeros", "scales"):
        info = tensors.get(f"{prefix}.{part}")
        if info is None:
            raise LayerShapeError(f"layer {prefix!r} has a qweight but no {part} tensor")
        parts[part] = info
    qweight, qzeros, scales = parts["qweight"], parts["qzeros"], parts["scales"]
    if prefix + ".weight" in tensors:
        raise LayerShapeError(
            f"layer {prefix!r} has both a qweight and a dense weight tensor; which one is "
            "the layer is ambiguous")
    for info, codes, what in ((qweight, _WORD_CODES, "packed 4-bit words"),
                              (qzeros, _WORD_CODES, "packed 4-bit zero points"),
                              (scales, _SCALE_CODES, "scales")):
        if info.dtype not in codes:
            raise LayerShapeError(
                f"{info.name}: dtype must be {' or '.join(codes)} ({what}); got {info.dtype}")
        if len(info.shape) != 2:
            raise LayerShapeError(
                f"{info.name}: must be 2-D; got shape {_shape(info.shape)}")
    K, words = qweight.shape
    N = 8 * words
    G = K if group_size == -1 else group_size
    if G and K % G:
        raise LayerShapeError(
            f"layer {prefix!r}: in_features K={K} (rows of qweight) is not a multiple of "
            f"group_size {G}")
    groups = K // G if G else 0
    for info, expected, form in ((qzeros, (groups, words), "[K/G, N/8]"),
                                 (scales, (groups, N), "[K/G, N]")):
        if info.shape != expected:
            raise LayerShapeError(
                f"layer {prefix!r}: {info.name.rsplit('.', 1)[1]} has shape "
                f"{_shape(info.shape)}; expected {form} = {_shape(expected)} for qweight "
                f"{_shape(qweight.shape)} (K={K}, N={N}) and group_size {G}")
    return QuantizedLayer(prefix, K, N, G, qweight, qzeros, scales)


def _check_group_size_arg(group_size):
    if group_size is None:
        return None
    try:
        G = operator.index(group_size)
    except TypeError:
        raise TypeError(f"group_size must be an integer; got {group_size!r}") from None
    if G < 1 and G != -1:
        raise ValueError(f"group_size must be a positive integer or -1 (per channel); got {G}")
    return G


def open_safetensors(src) -> tuple[Path, dict]:
    """(folder, name -> TensorInfo) of any safetensors checkpoint: a folder with
    model.safetensors or an index, or one .safetensors file. Reads headers only;
    TensorReader(folder, tensors) then reads the tensors."""
    path = Path(src)
    if path.is_dir():
        folder = path
        files, index = _find_shards(folder)
    elif path.is_file() and path.name.endswith(".safetensors"):
        folder, files, index = path.parent, (path.name,), None
    elif not path.exists():
        raise CheckpointFileError(f"{src}: no such file or folder")
    else:
        raise CheckpointFileError(f"{src}: expected a checkpoint folder or a .safetensors file")
    tensors, _ = _read_headers(folder, files, index)
    return folder, tensors


def _folder_config(folder: Path) -> tuple[dict, AWQConfig, str, set]:
    """config.json of a checkpoint folder, its validated quantization settings
    (config.json's quantization_config, else AutoAWQ's quant_config.json), where
    those came from, and the names of the files read."""
    config_path = folder / CONFIG_NAME
    if not config_path.is_file():
        raise CheckpointFileError(
            f"no {CONFIG_NAME} in {folder}: not a Hugging Face checkpoint folder "
            "(pass a .safetensors file and its group size instead)")
    config = _read_json(config_path, "config")
    if not isinstance(config, dict):
        raise CheckpointFileError(f"{config_path} must hold a JSON object")
    own = {CONFIG_NAME}
    qc, source = config.get("quantization_config"), f"{config_path}: quantization_config"
    autoawq_path = folder / AUTOAWQ_CONFIG_NAME
    if autoawq_path.is_file():
        own.add(AUTOAWQ_CONFIG_NAME)
        if qc is None:
            qc, source = _read_json(autoawq_path, "AutoAWQ config"), str(autoawq_path)
    if qc is None:
        raise NotAWQCheckpointError(
            f"{config_path} has no quantization_config: not a quantized checkpoint")
    return config, AWQConfig.from_dict(qc, source), source, own


def check_folder_config(folder) -> AWQConfig:
    """The quantization settings of the checkpoint folder `folder`, validated
    from its configuration files alone (no tensor file is read): raises
    CheckpointError as open_checkpoint does for them."""
    return _folder_config(Path(folder))[1]


def open_checkpoint(src, *, group_size=None) -> Checkpoint:
    """Read and validate the AWQ checkpoint at `src` (a folder or a .safetensors file).

    group_size: required for a bare .safetensors file unless every layer's
    shapes imply the same one; for a folder it must match the config's.
    Reads the configuration and the safetensors headers only. Raises
    CheckpointError (a ValueError) naming the file, tensor or setting at fault.
    """
    G_arg = _check_group_size_arg(group_size)
    path = Path(src)
    if not path.exists():
        raise CheckpointFileError(f"{src}: no such file or folder")
    config = index = None
    own = set()
    if path.is_dir():
        folder = path
        config, quant, source, own = _folder_config(folder)
        if G_arg is not None and G_arg != quant.group_size:
            raise CheckpointError(
                f"group_size {G_arg} disagrees with {source}'s group_size {quant.group_size}")
        files, index = _find_shards(folder)
        own.update(files)
        if index is not None:
            own.add(INDEX_NAME)
    elif path.name.endswith(".safetensors"):
        folder, files, quant = path.parent, (path.name,), None
        own.add(path.name)
    else:
        raise CheckpointFileError(
            f"{src}: expected a checkpoint folder or a .safetensors file")

    tensors, metadata = _read_headers(folder, files, index)
    prefixes = _layer_prefixes(tensors)
    if not prefixes:
        raise NotAWQCheckpointError(
            f"{path} holds no quantized layer (no tensor named <layer>.qweight)")
    if quant is None:
        G = G_arg if G_arg is not None else _infer_group_size(tensors, prefixes)
        quant = AWQConfig(group_size=G)
    layers = tuple(_check_layer(p, tensors, quant.group_size) for p in prefixes)
    in_layers = {t.name for layer in layers for t in layer.tensors}
    others = tuple(t for name, t in sorted(tensors.items()) if name not in in_layers)
    return Checkpoint(path=path, folder=folder, files=files, sharded=index is not None,
                      config=config, quant=quant, index=index, tensors=tensors,
                      layers=layers, others=others, file_metadata=metadata,
                      own_files=frozenset(own))
