"""Dense checkpoints from AWQ ones: ``awq-fast-dequant convert``.

convert() streams. Every output shape and dtype is known from the input's
safetensors headers, so each output shard's header is written first and its
tensors follow one at a time: a quantized layer is read (memory-mapped),
dequantized by the C core, transposed to nn.Linear's [out, in] layout and
handed to a writer thread while the next one is computed; every other tensor
is copied as the byte range it occupies in the input, by the kernel. Two
reused buffers (and one scratch buffer on the CPU) of the largest dense
layer's size hold the dense data.

Nothing is written before everything has been checked (open_checkpoint() for
the checkpoint, the options and DST here), and the result appears under DST
only when complete: it is built in a temporary folder next to DST, flushed to
disk, then renamed. Any exception, KeyboardInterrupt included, removes the
temporary folder.

Arrays: on the CPU, quantized layers are NumPy arrays; bfloat16 scales or
output need ml_dtypes, which safetensors' NumPy reader and the C core both
understand. With --device cuda they are torch tensors, dequantized and
transposed on the GPU and copied back into pinned host buffers for writing.
"""

from __future__ import annotations

import errno
import fnmatch
import json
import os
import re
import shutil
import struct
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import awq_fast_dequant as _awq

from .checkpoint import (
    DTYPE_SIZES,
    INDEX_NAME,
    SCALE_DTYPE_NAMES,
    CheckpointError,
    QuantizedLayer,
    TensorInfo,
    format_nbytes,
    open_checkpoint,
    tensor_nbytes,
)
from .reference import DTYPES

__all__ = ["convert", "ConvertStats", "ConvertError", "SafetensorsWriter", "add_subcommands"]

LAYOUTS = ("linear", "awq")
_DTYPE_CODES = {name: code for code, name in SCALE_DTYPE_NAMES.items()}

# Files of SRC that are not carried over: other weight files would describe
# the quantized model next to the dense one (quant_config.json, the AWQ
# settings, is in Checkpoint.own_files).
_STALE_PATTERNS = ("*.safetensors", "*.safetensors.index.json",
                   "pytorch_model*.bin", "pytorch_model*.bin.index.json")

# Rows of the dense [K, N] weight copied per step of the transposition: with
# a run of 16 rows, each output row's destination is 32 or 64 contiguous
# bytes (one cache line) and the 16 source rows stay in cache across the
# columns, which makes the strided copy several times faster than one
# whole-matrix copy.
_TRANSPOSE_ROWS = 16


class ConvertError(ValueError):
    """A conversion that cannot start: a bad option or destination."""


@dataclass
class ConvertStats:
    """What convert() did, and where its time went (seconds)."""

    layers: int = 0
    tensors_copied: int = 0
    files_copied: int = 0
    bytes_written: int = 0        # safetensors files: headers and tensor data
    seconds: float = 0.0          # wall time of the whole conversion
    read_seconds: float = 0.0     # reading tensors from SRC
    dequantize_seconds: float = 0.0
    transpose_seconds: float = 0.0  # to [out, in], with device transfers on CUDA
    write_wait_seconds: float = 0.0  # waiting for the writer thread
    device: str = "cpu"
    dtype: str = "float16"
    layout: str = "linear"
    skipped_files: list = field(default_factory=list)

    @property
    def gbps(self) -> float:
        return self.bytes_written / 1e9 / self.seconds if self.seconds > 0 else 0.0

    @property
    def dequantize_share(self) -> float:
        return self.dequantize_seconds / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        return (f"converted {self.layers} layers to {self.dtype} ({self.layout} layout) on "
                f"{self.device}, copied {self.tensors_copied} tensors and {self.files_copied} "
                f"files: {format_nbytes(self.bytes_written)} written in {self.seconds:.2f} s "
                f"({self.gbps:.2f} GB/s), {100 * self.dequantize_share:.1f}% of the time in "
                "dequantize")


@dataclass(frozen=True)
class _Job:
    """One tensor of the output: a dense layer or a copied tensor."""

    name: str
    dtype: str                  # safetensors code
    shape: tuple
    layer: QuantizedLayer | None = None
    tensor: TensorInfo | None = None

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.dtype, self.shape)


def _plan(ckpt, dtype: str, layout: str) -> dict:
    """Output file name -> its jobs, in writing order. Each shard keeps the
    tensors it had; a dense weight goes where its qweight was."""
    code = _DTYPE_CODES[dtype]
    jobs = {file: [] for file in ckpt.files}
    for layer in ckpt.layers:
        K, N = layer.in_features, layer.out_features
        shape = (N, K) if layout == "linear" else (K, N)
        jobs[layer.file].append(_Job(layer.weight_name, code, shape, layer=layer))
    for info in ckpt.others:
        jobs[info.file].append(_Job(info.name, info.dtype, info.shape, tensor=info))
    # Widest elements first, as safetensors itself orders them: with the data
    # starting 8-byte aligned, every tensor then starts aligned to its element.
    return {file: sorted(js, key=lambda j: (-DTYPE_SIZES[j.dtype], j.name))
            for file, js in jobs.items() if js}


class SafetensorsWriter:
    """Writes one safetensors file whose tensors are known up front, streaming.

    entries: (name, dtype code, shape) of every tensor, in the order their
    data will be written. The header goes out at once; then each tensor's
    bytes follow in that order, from memory (write) or straight from another
    file (copy_range), so only the tensor being written needs to be in memory.
    finish() flushes the file to disk.
    """

    def __init__(self, path, entries, metadata=None):
        header = {"__metadata__": dict(metadata)} if metadata else {}
        self._expected = []
        offset = 0
        for name, code, shape in entries:
            nbytes = tensor_nbytes(code, shape)
            header[name] = {"dtype": code, "shape": list(shape),
                            "data_offsets": [offset, offset + nbytes]}
            self._expected.append((name, nbytes))
            offset += nbytes
        if len(header) != len(self._expected) + bool(metadata):
            raise ValueError("entries must have distinct names")
        text = json.dumps(header, separators=(",", ":")).encode("utf-8")
        # Spaces pad the header so that the data (after the 8-byte length) starts 8-byte aligned.
        text += b" " * (-len(text) % 8)
        self.size = 8 + len(text) + offset
        self._done = 0
        self._unsynced = 0
        # A raw descriptor: write() and copy_range() both append at its offset.
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            _write_all(self._fd, struct.pack("<Q", len(text)) + text)
        except BaseException:
            self.abort()
            raise

    def _next(self, name: str, nbytes: int) -> None:
        expected, size = self._expected[self._done]
        if name != expected or nbytes != size:
            raise ValueError(f"expected tensor {expected} ({size} bytes) next; got {name} "
                             f"({nbytes} bytes)")

    def write(self, name: str, data) -> None:
        """Write the next tensor's data: a contiguous NumPy array of its bytes."""
        self._next(name, data.nbytes)
        _write_all(self._fd, memoryview(_numpy_bytes(data)))
        self._written(data.nbytes)

    def copy_range(self, name: str, path, offset: int, nbytes: int) -> None:
        """Write the next tensor's data from bytes offset..offset+nbytes of the file `path`."""
        self._next(name, nbytes)
        with open(path, "rb") as src:
            _copy_range(src.fileno(), self._fd, offset, nbytes)
        self._written(nbytes)

    def _written(self, nbytes: int) -> None:
        self._done += 1
        self._unsynced += nbytes
        if self._unsynced >= _SYNC_BYTES:
            # Left to itself the kernel may hold gigabytes of dirty pages and
            # write them all at finish(); starting the writeback as we go keeps
            # the disk busy while the next tensors are computed.
            _start_writeback(self._fd)
            self._unsynced = 0

    def finish(self) -> None:
        """Flush to disk and close: the rename that publishes DST must not
        outrun the data."""
        if self._done != len(self._expected):
            raise ValueError(f"{self._done} of {len(self._expected)} tensors written")
        os.fsync(self._fd)
        self.abort()

    def abort(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# Bytes written between two writebacks started.
_SYNC_BYTES = 256 << 20


def _start_writeback(fd: int) -> None:
    """Send the file's dirty pages to the disk. On Linux, POSIX_FADV_DONTNEED
    starts their writeback without waiting for it (and drops the pages already
    written, so the output does not crowd the page cache); elsewhere the
    writer thread waits for an fdatasync."""
    if hasattr(os, "posix_fadvise") and sys.platform.startswith("linux"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    else:
        getattr(os, "fdatasync", os.fsync)(fd)


def _write_all(fd: int, data) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view):]  # one write(2) moves at most ~2 GB


# Bytes per read/write when the kernel cannot copy between the files itself.
_COPY_CHUNK = 16 << 20


def _copy_range(src: int, dst: int, offset: int, count: int) -> None:
    """Append bytes offset..offset+count of src to dst: copy_file_range(2)
    copies inside the kernel (no user memory; a reflink on file systems that
    share blocks); pread/write otherwise."""
    kernel_copy = getattr(os, "copy_file_range", None)
    while count:
        if kernel_copy is not None:
            try:
                done = kernel_copy(src, dst, count, offset)
            except OSError as e:
                if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP,
                                   errno.EBADF, errno.EPERM):
                    raise
                kernel_copy = None  # e.g. across file systems on older kernels
                continue
        else:
            chunk = os.pread(src, min(count, _COPY_CHUNK), offset)
            _write_all(dst, chunk)
            done = len(chunk)
        if done == 0:
            raise OSError(errno.EIO, f"unexpected end of file copying {count} bytes at {offset}")
        offset += done
        count -= done


def _numpy_bytes(arr) -> np.ndarray:
    """A flat uint8 view of a NumPy array's data."""
    return np.ascontiguousarray(arr).reshape(-1).view(np.uint8)


def _transpose(w: np.ndarray, out: np.ndarray, pool, workers: int) -> None:
    """out[N, K] = w[K, N].T, runs of rows spread over `workers` threads of
    `pool` (NumPy releases the GIL while it copies)."""
    K = w.shape[0]
    step = _TRANSPOSE_ROWS

    def rows(k0, k1):
        for k in range(k0, k1, step):
            np.copyto(out[:, k:min(k + step, k1)], w[k:min(k + step, k1)].T)

    chunk = max(step, -(-K // (workers * step)) * step)  # rows per thread, a multiple of step
    bounds = [(k, min(k + chunk, K)) for k in range(0, K, chunk)]
    if len(bounds) < 2:
        for b in bounds:
            rows(*b)
    else:
        for f in [pool.submit(rows, *b) for b in bounds]:
            f.result()


class _Buffers:
    """Two output buffers used in turn, each as large as the largest layer:
    one is being written while the next layer is computed into the other.
    Reusing them spares the page faults of a fresh allocation per layer."""

    def __init__(self, allocate, nbytes: int):
        self._buffers = [allocate(nbytes), allocate(nbytes)]
        self._turn = 0

    def next(self):
        self._turn ^= 1
        return self._buffers[self._turn]


def _max_dense_bytes(ckpt, dtype: str) -> int:
    itemsize = DTYPE_SIZES[_DTYPE_CODES[dtype]]
    return max(layer.in_features * layer.out_features for layer in ckpt.layers) * itemsize


class _NumpyBackend:
    """CPU: NumPy arrays, the C core's CPU path."""

    framework = "numpy"

    def __init__(self, dtype: str, layout: str, max_bytes: int):
        from ._frameworks import numpy_dtype

        self.dtype, self.layout = dtype, layout
        self._np_dtype = numpy_dtype(dtype)
        self._out = _Buffers(lambda n: np.empty(n, np.uint8), max_bytes)
        self._scratch = np.empty(max_bytes if layout == "linear" else 0, np.uint8)
        self._workers = min(8, os.cpu_count() or 1)
        self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="awq-transpose")

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def _view(self, buffer: np.ndarray, shape) -> np.ndarray:
        n = shape[0] * shape[1] * self._np_dtype.itemsize
        return buffer[:n].view(self._np_dtype).reshape(shape)

    def dense(self, reader, layer: QuantizedLayer, stats: ConvertStats) -> np.ndarray:
        K, N = layer.in_features, layer.out_features
        t0 = time.perf_counter()
        qweight, qzeros, scales = (reader.get(t.name) for t in layer.tensors)
        t1 = time.perf_counter()
        buffer = self._out.next()
        w = self._view(self._scratch if self.layout == "linear" else buffer, (K, N))
        _awq.dequantize(qweight, qzeros, scales, group_size=layer.group_size or None, out=w,
                        out_dtype=self.dtype)
        t2 = time.perf_counter()
        if self.layout == "linear":
            wt = self._view(buffer, (N, K))
            _transpose(w, wt, self._pool, self._workers)
            w = wt
        t3 = time.perf_counter()
        stats.read_seconds += t1 - t0
        stats.dequantize_seconds += t2 - t1
        stats.transpose_seconds += t3 - t2
        return _numpy_bytes(w)


class _TorchBackend:
    """CUDA: torch tensors read on the host, dequantized and transposed on the
    device, copied back into pinned host buffers for writing."""

    framework = "pt"

    def __init__(self, dtype: str, layout: str, device, max_bytes: int):
        import torch

        self.torch, self.device = torch, device
        self.dtype, self.layout = dtype, layout
        self._torch_dtype = getattr(torch, dtype)

        def allocate(n):
            try:  # pinned memory: faster copies from the device
                return torch.empty(n, dtype=torch.uint8, pin_memory=True)
            except RuntimeError:
                return torch.empty(n, dtype=torch.uint8)

        self._out = _Buffers(allocate, max_bytes)

    def close(self) -> None:
        pass

    def dense(self, reader, layer: QuantizedLayer, stats: ConvertStats) -> np.ndarray:
        torch, device = self.torch, self.device
        t0 = time.perf_counter()
        host = [reader.get(t.name) for t in layer.tensors]
        t1 = time.perf_counter()
        qweight, qzeros, scales = (t.to(device) for t in host)
        torch.cuda.synchronize(device)
        t2 = time.perf_counter()
        w = _awq.dequantize(qweight, qzeros, scales, group_size=layer.group_size or None,
                            out_dtype=self.dtype)
        torch.cuda.synchronize(device)
        t3 = time.perf_counter()
        if self.layout == "linear":
            w = w.t().contiguous()
        buffer = self._out.next()[: w.numel() * w.element_size()]
        buffer.view(self._torch_dtype).view(w.shape).copy_(w)
        t4 = time.perf_counter()
        stats.read_seconds += t1 - t0
        stats.dequantize_seconds += t3 - t2
        stats.transpose_seconds += (t2 - t1) + (t4 - t3)
        return buffer.numpy()


def _check_no_scaled_activations(ckpt) -> None:
    """AutoAWQ's scaled activations (Checkpoint.activation_scales): a dense checkpoint
    has no place for them, and transformers would load it without them and compute
    wrong outputs. Refused, before anything is written."""
    lone = [t.name for t in ckpt.activation_scales]
    if lone:
        more = f" and {len(lone) - 3} more" if len(lone) > 3 else ""
        raise ConvertError(
            f"{ckpt.path}: the checkpoint holds AutoAWQ's scaled activations "
            f"({', '.join(lone[:3])}{more}), which a dense checkpoint has no place for "
            "(transformers would load it without them and compute wrong outputs); run it "
            "with awq_fast_dequant.torch.load_pretrained, which applies them")


def _check_dtype(dtype, ckpt) -> str:
    if dtype is None:
        kinds = {layer.scales_dtype for layer in ckpt.layers}
        # Mixed scales: float32 holds every value of both exactly.
        return kinds.pop() if len(kinds) == 1 else "float32"
    if dtype not in DTYPES:
        raise ConvertError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
    return dtype


def _check_layout(layout) -> str:
    if layout not in LAYOUTS:
        raise ConvertError(
            f"layout must be 'linear' ([out_features, in_features], nn.Linear's) or 'awq' "
            f"([in_features, out_features]); got {layout!r}")
    return layout


def _backend(device, dtype: str, layout: str, ckpt):
    """The backend for `device`, after checking that it can run here."""
    if not isinstance(device, str):
        device = str(device)  # a torch.device
    if device == "cpu":
        needs_bf16 = dtype == "bfloat16" or any(
            layer.scales.dtype == "BF16" for layer in ckpt.layers)
        if needs_bf16:
            try:
                import ml_dtypes  # noqa: F401
            except ImportError:
                raise ConvertError(
                    "bfloat16 on the CPU needs ml_dtypes (pip install ml_dtypes), "
                    "or convert with --device cuda") from None
        return _NumpyBackend(dtype, layout, _max_dense_bytes(ckpt, dtype))
    match = re.fullmatch(r"cuda(?::(\d+))?", device)
    if not match:
        raise ConvertError(f"device must be 'cpu', 'cuda' or 'cuda:N'; got {device!r}")
    if not _awq.cuda_available():
        raise ConvertError(
            f"device {device!r}: this build of awq_fast_dequant has no usable CUDA device "
            "(a CPU-only build, or no GPU); use --device cpu")
    try:
        import torch
    except ImportError:
        raise ConvertError(f"device {device!r} needs torch (pip install torch)") from None
    index = int(match.group(1) or 0)
    count = torch.cuda.device_count()
    if index >= count:
        raise ConvertError(f"device {device!r}: torch sees {count} CUDA device(s)")
    return _TorchBackend(dtype, layout, torch.device("cuda", index),
                         _max_dense_bytes(ckpt, dtype))


def _check_destination(dst, ckpt, overwrite: bool) -> Path:
    dst = Path(dst)
    target, source = dst.resolve(), ckpt.path.resolve()
    if source == target or source.is_relative_to(target):
        raise ConvertError(f"DST {dst} holds SRC {ckpt.path}; choose another folder")
    if ckpt.path.is_dir() and target.is_relative_to(source):
        raise ConvertError(f"DST {dst} is inside SRC {ckpt.path}; choose another folder")
    if dst.exists():
        if not dst.is_dir():
            raise ConvertError(f"DST {dst} exists and is not a folder")
        if not overwrite and any(dst.iterdir()):
            raise ConvertError(f"DST {dst} exists and is not empty; pass --overwrite to replace it")
    for parent in target.parents:
        if parent.exists():
            if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
                raise ConvertError(f"cannot create DST {dst}: {parent} is not a writable folder")
            break
    return dst


def _files_to_copy(ckpt, stats: ConvertStats) -> list:
    """The entries of SRC's folder that go to DST as they are."""
    if not ckpt.path.is_dir():
        return []
    keep = []
    for entry in sorted(ckpt.folder.iterdir()):
        name = entry.name
        if name in ckpt.own_files or name.startswith("."):
            continue  # rewritten (config, index, shards), or hidden (.git, caches)
        if any(fnmatch.fnmatch(name, p) for p in _STALE_PATTERNS):
            stats.skipped_files.append(name)
            continue
        keep.append(entry)
    return keep


def _dense_config(config: dict, dtype: str) -> dict:
    out = {k: v for k, v in config.items() if k != "quantization_config"}
    out["torch_dtype"] = dtype
    if "dtype" in out:  # newer transformers name the same setting "dtype"
        out["dtype"] = dtype
    return out


def _file_metadata(metadata) -> dict:
    out = dict(metadata or {})
    out.setdefault("format", "pt")  # transformers refuses safetensors files without it
    return out


def _write_json(path: Path, obj) -> None:
    with open(path, "x", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    """Flush a copied file, or a copied folder and everything in it, to disk."""
    if path.is_dir():
        for entry in path.iterdir():
            _fsync_tree(entry)
    elif not path.is_file():
        return
    _fsync_path(path)  # fsync through a read-only descriptor works for files too


def _new_folder_next_to(dst: Path, tag: str) -> Path:
    """A new hidden folder beside dst. Made by os.mkdir rather than mkdtemp,
    so that it gets the usual permissions (the umask's), not 0700: it becomes DST."""
    for _ in range(100):
        path = dst.absolute().parent / f".{dst.name}.{tag}-{os.getpid()}-{os.urandom(4).hex()}"
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"cannot create a temporary folder next to {dst}")


def _publish(tmp: Path, dst: Path) -> None:
    """Rename the finished folder to DST, replacing an existing DST."""
    if dst.exists():
        old = _new_folder_next_to(dst, "old")
        os.replace(dst, old)  # onto an empty folder: allowed by rename(2)
        try:
            os.replace(tmp, dst)
        except BaseException:
            os.replace(old, dst)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, dst)
    _fsync_path(dst.parent)


class _Progress:
    """A tqdm bar over bytes written, with the layer count; nothing without tqdm."""

    def __init__(self, enabled: bool, total_bytes: int, layers: int):
        self.bar, self.layers, self.done = None, layers, 0
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self.bar = tqdm(total=total_bytes, unit="B", unit_scale=True, unit_divisor=1000,
                            desc="convert", dynamic_ncols=True, file=sys.stderr)
            self.bar.set_postfix_str(f"layers 0/{layers}")

    def advance(self, job: _Job) -> None:
        if self.bar is None:
            return
        if job.layer is not None:
            self.done += 1
            self.bar.set_postfix_str(f"layers {self.done}/{self.layers}", refresh=False)
        self.bar.update(job.nbytes)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _write_shards(ckpt, plan: dict, backend, reader, tmp: Path, stats, progress) -> dict:
    """Write every output shard into tmp; returns the weight map."""
    weight_map = {}
    writers = []
    pending = None  # (future, job) of the write in flight
    with ThreadPoolExecutor(1, thread_name_prefix="awq-writer") as pool:
        try:
            for file, jobs in plan.items():
                writer = SafetensorsWriter(tmp / file, [(j.name, j.dtype, j.shape) for j in jobs],
                                           _file_metadata(ckpt.file_metadata[file]))
                writers.append(writer)
                stats.bytes_written += writer.size
                for job in jobs:
                    if job.layer is not None:
                        data = backend.dense(reader, job.layer, stats)
                        task = (writer.write, job.name, data)
                        stats.layers += 1
                    else:  # the bytes as they are, copied by the writer thread
                        info = job.tensor
                        task = (writer.copy_range, job.name, ckpt.folder / info.file,
                                info.offset, job.nbytes)
                        stats.tensors_copied += 1
                    # One write in flight while the next tensor is computed:
                    # at most two dense tensors are alive.
                    if pending is not None:
                        t0 = time.perf_counter()
                        pending[0].result()
                        stats.write_wait_seconds += time.perf_counter() - t0
                        progress.advance(pending[1])
                    pending = (pool.submit(*task), job)
                    weight_map[job.name] = file
                    del task
                t0 = time.perf_counter()
                pending[0].result()
                progress.advance(pending[1])
                pending = None
                writer.finish()
                stats.write_wait_seconds += time.perf_counter() - t0
        except BaseException:
            if pending is not None:
                pending[0].cancel()
            pool.shutdown(wait=True)
            for writer in writers:
                writer.abort()
            raise
    return weight_map


def convert(src, dst, *, dtype=None, device="cpu", layout="linear", group_size=None,
            overwrite=False, progress=False) -> ConvertStats:
    """Convert the AWQ checkpoint `src` into a dense safetensors checkpoint in folder `dst`.

    src: a Hugging Face AWQ checkpoint folder, or one .safetensors file (then
        group_size is needed unless the layers' shapes imply it).
    dtype: 'float16', 'bfloat16' or 'float32'; default: the scales' dtype.
    device: 'cpu', 'cuda' or 'cuda:N' (needs torch and a CUDA build).
    layout: 'linear' writes each <layer>.weight as [out_features, in_features]
        (nn.Linear); 'awq' keeps [in_features, out_features].
    overwrite: replace a non-empty dst.
    progress: show a tqdm progress bar on stderr.

    Every other tensor is copied unchanged, shards mirror src's (with a new
    index), config.json loses quantization_config and gets torch_dtype, and
    the other files of src's folder are copied. A checkpoint with AutoAWQ's
    scaled activations (<activation>.scales) is refused: a dense one has no
    place for them. Raises CheckpointError or
    ConvertError (both ValueError) before writing anything; on any failure
    nothing is left under dst.
    """
    start = time.perf_counter()
    ckpt = open_checkpoint(src, group_size=group_size)
    _check_no_scaled_activations(ckpt)
    dtype = _check_dtype(dtype, ckpt)
    layout = _check_layout(layout)
    dst = _check_destination(dst, ckpt, overwrite)
    backend = _backend(device, dtype, layout, ckpt)
    try:
        stats = ConvertStats(device=str(device), dtype=dtype, layout=layout)
        copies = _files_to_copy(ckpt, stats)
        plan = _plan(ckpt, dtype, layout)
        total_bytes = sum(j.nbytes for js in plan.values() for j in js)
        reader = ckpt.open_tensors(backend.framework,
                                   [t.name for layer in ckpt.layers for t in layer.tensors])
        with reader:
            dst.absolute().parent.mkdir(parents=True, exist_ok=True)
            tmp = _new_folder_next_to(dst, "partial")
            bar = _Progress(progress, total_bytes, len(ckpt.layers))
            try:
                weight_map = _write_shards(ckpt, plan, backend, reader, tmp, stats, bar)
                if ckpt.sharded:
                    meta = ckpt.index.get("metadata")
                    meta = {k: v for k, v in meta.items() if k != "total_size"} \
                        if isinstance(meta, dict) else {}
                    meta["total_size"] = total_bytes
                    _write_json(tmp / INDEX_NAME,
                                {"metadata": meta, "weight_map": dict(sorted(weight_map.items()))})
                if ckpt.config is not None:
                    _write_json(tmp / "config.json", _dense_config(ckpt.config, dtype))
                for entry in copies:
                    if entry.is_dir():
                        shutil.copytree(entry, tmp / entry.name)
                    else:
                        shutil.copy2(entry, tmp / entry.name)
                    _fsync_tree(tmp / entry.name)
                    stats.files_copied += 1
                _fsync_path(tmp)
                _publish(tmp, dst)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            finally:
                bar.close()
    finally:
        backend.close()
    stats.seconds = time.perf_counter() - start
    return stats


# ---------------------------------------------------------------------------- command line

def _cmd_convert(args) -> int:
    try:
        stats = convert(args.src, args.dst, dtype=args.dtype, device=args.device,
                        layout=args.layout, group_size=args.group_size,
                        overwrite=args.overwrite, progress=not args.no_progress)
    except (CheckpointError, ConvertError, ImportError) as e:
        print(f"{args.prog} convert: error: {e}", file=sys.stderr)
        return 2
    if stats.skipped_files:
        print(f"not copied (weights of the quantized model): {', '.join(stats.skipped_files)}",
              file=sys.stderr)
    print(stats.summary())
    return 0


def add_subcommands(subparsers, prog: str = "awq-fast-dequant") -> None:
    """Add the convert and inspect commands to an argparse subparsers object;
    each sets args.run, which returns the exit status."""
    p = subparsers.add_parser(
        "convert", help="AWQ checkpoint -> dense float16/bfloat16/float32 safetensors checkpoint",
        description="Dequantize every AWQ layer of SRC into a dense <layer>.weight, copy every "
                    "other tensor and file, and write the result to the folder DST (complete or "
                    "not at all).",
        epilog=f"example: {prog} convert ./Llama-3-8B-AWQ ./Llama-3-8B-fp16 --device cuda")
    p.add_argument("src", metavar="SRC",
                   help="a Hugging Face AWQ checkpoint folder, or one .safetensors file")
    p.add_argument("dst", metavar="DST", help="the folder to create")
    p.add_argument("--dtype", choices=DTYPES, default=None,
                   help="dtype of the dense weights (default: the scales' dtype, float16 for "
                        "most AWQ checkpoints)")
    p.add_argument("--device", default="cpu",
                   help="where to dequantize: cpu, cuda or cuda:N (default: cpu)")
    p.add_argument("--layout", choices=LAYOUTS, default="linear",
                   help="linear: [out_features, in_features] as nn.Linear; awq: [in_features, "
                        "out_features] (default: linear)")
    p.add_argument("--group-size", type=int, default=None,
                   help="group size of a bare .safetensors SRC (default: from config.json, or "
                        "inferred from the shapes); -1 for per-channel")
    p.add_argument("--overwrite", action="store_true",
                   help="replace DST if it exists and is not empty (default: refuse)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (default: a bar on stderr)")
    p.set_defaults(run=_cmd_convert, prog=prog)

    from .inspect_ckpt import add_subcommand

    add_subcommand(subparsers, prog)
