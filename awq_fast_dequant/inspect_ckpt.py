"""``awq-fast-dequant inspect``: what an AWQ checkpoint holds, layer by layer.

For every quantized layer: its shape, group size and scales dtype, and
statistics of its dequantized weights (computed exactly, in float32, by the
C core): min, max, mean |w|, how many are not finite, and the share of
weights at an end of their group's range (4-bit value 0 or 15). Min-max
quantization puts about 2/G of the weights there; a much larger share means
clipped groups, or scales that do not fit the weights.

Given the dense weights the checkpoint was quantized from (--reference), it
also measures the quantization error: max |w - w_ref| in steps (a step is the
group's scale; round-to-nearest gives at most 0.5) and mean |w - w_ref|.

Layers are read one at a time and processed in blocks of rows, so memory stays
bounded whatever the model's size.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass

import numpy as np

import awq_fast_dequant as _awq

from .checkpoint import CheckpointError, TensorReader, open_checkpoint, open_safetensors

__all__ = ["LayerStats", "CheckpointReport", "inspect_checkpoint", "format_report"]

# Elements of a layer processed at once: the float32 temporaries stay at a
# few tens of MB.
_BLOCK_ELEMS = 1 << 22


@dataclass
class LayerStats:
    """Statistics of one layer's dequantized weight [in_features, out_features]."""

    name: str
    in_features: int
    out_features: int
    group_size: int
    scales_dtype: str
    min: float
    max: float
    mean_abs: float
    at_range_ends: float           # share of weights whose 4-bit value is 0 or 15
    nonfinite: int                 # NaN or infinite weights (from NaN/Inf scales)
    max_err_steps: float | None = None   # with a reference: max |w - w_ref| / step
    mean_abs_err: float | None = None    # with a reference: mean |w - w_ref|


@dataclass
class CheckpointReport:
    path: str
    quantization: dict
    files: int
    other_tensors: int
    layers: list
    total: LayerStats | None       # every layer together (name "all")

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def _max(a: float, b: float) -> float:
    """max() that keeps a NaN (Python's max drops it when it comes second)."""
    return a if (a != a or a >= b) else b


class _Accumulator:
    """Running statistics over blocks of one layer, or over layers."""

    def __init__(self):
        self.count = 0
        self.min, self.max = np.inf, -np.inf   # over finite weights
        self.sum_abs = 0.0                     # over finite weights
        self.ends = 0
        self.nonfinite = 0
        self.max_err_steps = 0.0
        self.sum_err = 0.0

    def add_weights(self, w: np.ndarray, q: np.ndarray) -> None:
        self.count += w.size
        finite = np.isfinite(w)
        bad = w.size - int(np.count_nonzero(finite))
        if bad:
            self.nonfinite += bad
            w = w[finite]
        if w.size:
            self.min = min(self.min, float(w.min()))
            self.max = max(self.max, float(w.max()))
            self.sum_abs += float(np.abs(w).sum(dtype=np.float64))
        self.ends += int(np.count_nonzero((q == 0) | (q == 15)))

    def add_error(self, w: np.ndarray, ref: np.ndarray, step: np.ndarray) -> None:
        err = np.abs(w - ref)
        with np.errstate(divide="ignore", invalid="ignore"):
            # A zero step leaves a zero weight: in steps, no error is 0 and any error infinite.
            steps = np.where(step > 0, err / step, np.where(err == 0, 0.0, np.inf))
        if steps.size:
            self.max_err_steps = _max(self.max_err_steps, float(np.max(steps)))
        self.sum_err += float(err.sum(dtype=np.float64))

    def merge(self, other: "_Accumulator") -> None:
        self.count += other.count
        self.min, self.max = min(self.min, other.min), max(self.max, other.max)
        self.sum_abs += other.sum_abs
        self.ends += other.ends
        self.nonfinite += other.nonfinite
        self.max_err_steps = _max(self.max_err_steps, other.max_err_steps)
        self.sum_err += other.sum_err

    def stats(self, name, K, N, G, scales_dtype, with_error: bool) -> LayerStats:
        n = max(self.count, 1)
        finite = self.count - self.nonfinite
        return LayerStats(
            name=name, in_features=K, out_features=N, group_size=G, scales_dtype=scales_dtype,
            min=float(self.min) if finite else float("nan"),
            max=float(self.max) if finite else float("nan"),
            mean_abs=self.sum_abs / finite if finite else float("nan"),
            at_range_ends=self.ends / n,
            nonfinite=self.nonfinite,
            max_err_steps=self.max_err_steps if with_error else None,
            mean_abs_err=self.sum_err / n if with_error else None)


def _reference_weight(ref_reader, ref_tensors, layer):
    """The dense reference weight of `layer` as float32 [N, K] (nn.Linear's layout)."""
    info = ref_tensors.get(layer.weight_name)
    if info is None:
        raise CheckpointError(f"the reference has no tensor {layer.weight_name!r}")
    K, N = layer.in_features, layer.out_features
    if info.shape != (N, K):
        raise CheckpointError(
            f"reference {layer.weight_name}: shape {list(info.shape)}; expected [out_features, "
            f"in_features] = [{N}, {K}] (nn.Linear's layout)")
    if info.dtype not in ("F16", "BF16", "F32", "F64"):
        raise CheckpointError(
            f"reference {layer.weight_name}: dtype {info.dtype}; expected a float type")
    if info.dtype == "BF16":
        try:
            import ml_dtypes  # noqa: F401  (lets safetensors return bfloat16 to NumPy)
        except ImportError:
            raise CheckpointError(
                f"reference {layer.weight_name} is bfloat16, which NumPy reads only with "
                "ml_dtypes: pip install ml_dtypes") from None
    return np.asarray(ref_reader.get(info.name), dtype=np.float32)


def _layer_stats(reader, layer, ref) -> _Accumulator:
    qweight, qzeros, scales = (reader.get(t.name) for t in layer.tensors)
    K, N, G = layer.in_features, layer.out_features, layer.group_size
    acc = _Accumulator()
    if K == 0 or N == 0:
        return acc
    rows = max(G, (_BLOCK_ELEMS // max(N, 1)) // G * G)  # whole groups per block
    for k0 in range(0, K, rows):
        k1, g0, g1 = min(K, k0 + rows), k0 // G, -(-min(K, k0 + rows) // G)
        w = _awq.dequantize(qweight[k0:k1], qzeros[g0:g1], scales[g0:g1], group_size=G,
                            out_dtype="float32")
        acc.add_weights(w, _awq.unpack(qweight[k0:k1]))
        if ref is not None:
            step = np.repeat(np.abs(np.asarray(scales[g0:g1], dtype=np.float32)), G, axis=0)
            acc.add_error(w, ref[:, k0:k1].T, step)
    return acc


def inspect_checkpoint(src, *, group_size=None, reference=None, progress=False) -> CheckpointReport:
    """Statistics of every quantized layer of the AWQ checkpoint `src`.

    reference: a dense safetensors checkpoint (folder or file) holding
    <layer>.weight in nn.Linear's [out, in] layout for every quantized layer,
    e.g. the model that was quantized; adds the quantization error.
    Raises CheckpointError for a bad checkpoint or reference.
    """
    ckpt = open_checkpoint(src, group_size=group_size)
    ref_folder = ref_tensors = None
    if reference is not None:
        ref_folder, ref_tensors = open_safetensors(reference)
    bar = None
    if progress:
        try:
            from tqdm import tqdm

            bar = tqdm(total=len(ckpt.layers), unit="layer", desc="inspect", file=sys.stderr)
        except ImportError:
            pass
    layers, total = [], _Accumulator()
    names = [t.name for layer in ckpt.layers for t in layer.tensors]
    with ckpt.open_tensors("numpy", names) as reader, \
            TensorReader(ref_folder or ckpt.folder, ref_tensors or {}) as ref_reader:
        for layer in ckpt.layers:
            ref = (_reference_weight(ref_reader, ref_tensors, layer)
                   if reference is not None else None)
            acc = _layer_stats(reader, layer, ref)
            del ref
            layers.append(acc.stats(layer.prefix, layer.in_features, layer.out_features,
                                    layer.group_size, layer.scales_dtype, reference is not None))
            total.merge(acc)
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    G = {s.group_size for s in layers}
    dtypes = {s.scales_dtype for s in layers}
    summary = total.stats("all", sum(s.in_features for s in layers),
                          sum(s.out_features for s in layers),
                          G.pop() if len(G) == 1 else -1,
                          dtypes.pop() if len(dtypes) == 1 else "mixed", reference is not None)
    return CheckpointReport(path=str(ckpt.path), quantization=ckpt.quant.to_dict(),
                            files=len(ckpt.files), other_tensors=len(ckpt.others),
                            layers=layers, total=summary)


def _fmt(x, spec) -> str:
    return "-" if x is None else format(x, spec)


def format_report(report: CheckpointReport) -> str:
    """The report as a text table, one layer a line and a total."""
    q = report.quantization
    lines = [
        f"{report.path}: AWQ {q['bits']}-bit, group_size {q['group_size']}, version "
        f"{q['version']}; {len(report.layers)} quantized layers, {report.other_tensors} other "
        f"tensors in {report.files} file(s)"]
    with_error = report.total is not None and report.total.max_err_steps is not None
    head = ["layer", "in x out", "G", "scales", "min", "max", "mean|w|", "at ends", "nonfinite"]
    if with_error:
        head += ["max err/step", "mean|err|"]
    rows = []
    for s in report.layers + ([report.total] if report.total else []):
        row = [s.name, f"{s.in_features}x{s.out_features}", str(s.group_size), s.scales_dtype,
               f"{s.min:.4g}", f"{s.max:.4g}", f"{s.mean_abs:.4g}",
               f"{100 * s.at_range_ends:.2f}%", str(s.nonfinite)]
        if with_error:
            row += [_fmt(s.max_err_steps, ".4f"), _fmt(s.mean_abs_err, ".4g")]
        rows.append(row)
    if report.total:
        rows[-1][1] = "-"  # the sum of shapes means nothing
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    lines.append("  ".join(h.ljust(w) for h, w in zip(head, widths)))
    for r in rows:
        lines.append("  ".join(v.ljust(w) for v, w in zip(r, widths)))
    return "\n".join(lines)


def _cmd_inspect(args) -> int:
    try:
        report = inspect_checkpoint(args.src, group_size=args.group_size,
                                    reference=args.reference, progress=not args.no_progress)
    except (CheckpointError, ImportError) as e:
        print(f"{args.prog} inspect: error: {e}", file=sys.stderr)
        return 2
    print(report.to_json() if args.json else format_report(report))
    return 0


def add_subcommand(subparsers, prog: str = "awq-fast-dequant") -> None:
    """Add the inspect command to an argparse subparsers object (sets args.run)."""
    p = subparsers.add_parser(
        "inspect", help="list an AWQ checkpoint's layers with statistics of their weights",
        description="For every quantized layer: shape, group size, scales dtype, and min, max, "
                    "mean |w|, non-finite count and share at the ends of the group's range of "
                    "the dequantized weights; with --reference, the quantization error.",
        epilog=f"example: {prog} inspect ./Llama-3-8B-AWQ --reference ./Llama-3-8B")
    p.add_argument("src", metavar="SRC",
                   help="a Hugging Face AWQ checkpoint folder, or one .safetensors file")
    p.add_argument("--group-size", type=int, default=None,
                   help="group size of a bare .safetensors SRC (default: from config.json, or "
                        "inferred from the shapes)")
    p.add_argument("--reference", metavar="DENSE", default=None,
                   help="dense checkpoint (folder or .safetensors) with each layer's weight as "
                        "[out, in], e.g. the model before quantization: adds max |err| in steps "
                        "and mean |err| (default: none)")
    p.add_argument("--json", action="store_true", help="print JSON (default: a table)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (default: a bar on stderr)")
    p.set_defaults(run=_cmd_inspect, prog=prog)
