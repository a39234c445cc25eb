"""awq-fast-dequant convert: synthetic checkpoints converted and compared tensor by
tensor with the NumPy reference; every bad input refused with nothing left
under DST; failures midway leave no DST; layouts, dtypes, the command line.
Skipped without safetensors."""

import json
import os
import struct
import tracemalloc

import numpy as np
import pytest

pytest.importorskip("safetensors", reason="convert needs safetensors")

import awq_fast_dequant as awq  # noqa: E402
from awq_fast_dequant import checkpoint as ck  # noqa: E402
from awq_fast_dequant import convert as cv  # noqa: E402
from awq_fast_dequant import reference  # noqa: E402
from awq_fast_dequant.__main__ import main  # noqa: E402

from checkpoint_helpers import (  # noqa: E402
    G, layer_prefixes, make_tensors, model_config, read_all, write_checkpoint)

CODES = {"float16": "F16", "bfloat16": "BF16", "float32": "F32"}


@pytest.fixture
def tensors(rng):
    return make_tensors(rng)


def converted(dst) -> dict:
    """Every tensor under dst (all shards), by name."""
    out = {}
    for f in sorted(dst.glob("*.safetensors")):
        part = read_all(f)
        assert not set(part) & set(out)
        out.update(part)
    return out


def header(path) -> dict:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def check_against_reference(tensors, got, dtype="float16", layout="linear", group_size=G):
    """Each dense weight bit-exact with the reference; every other tensor unchanged."""
    prefixes = layer_prefixes(tensors)
    packed = {f"{p}.{x}" for p in prefixes for x in ("qweight", "qzeros", "scales")}
    expected_names = {p + ".weight" for p in prefixes} | (set(tensors) - packed)
    assert set(got) == expected_names
    for p in prefixes:
        qw, qz, sc = (tensors[f"{p}.{x}"] for x in ("qweight", "qzeros", "scales"))
        want = reference.dequantize(qw, qz, sc, group_size=group_size, out_dtype=dtype)
        w = got[p + ".weight"]
        assert w.shape == (want.shape[::-1] if layout == "linear" else want.shape)
        reference.assert_bitexact(w.T if layout == "linear" else w, want)
    for name in expected_names - {p + ".weight" for p in prefixes}:
        assert got[name].dtype == tensors[name].dtype and got[name].shape == tensors[name].shape
        assert got[name].tobytes() == tensors[name].tobytes(), name


def assert_nothing_left(tmp_path, dst):
    """No DST, and no temporary folder beside it."""
    assert not dst.exists()
    assert [p.name for p in dst.parent.iterdir() if p.name.startswith(f".{dst.name}.")] == []


# ---------------------------------------------------------------------------- conversions

@pytest.mark.parametrize("shards", [1, 3])
def test_convert_matches_reference_tensor_by_tensor(tmp_path, tensors, shards):
    src = write_checkpoint(tmp_path / "src", tensors, shards=shards)
    stats = cv.convert(src, tmp_path / "dst")
    dst = tmp_path / "dst"
    got = converted(dst)
    check_against_reference(tensors, got)
    assert stats.layers == len(layer_prefixes(tensors))
    assert stats.tensors_copied == len(got) - stats.layers
    assert stats.bytes_written == sum(f.stat().st_size for f in dst.glob("*.safetensors"))
    # the shards mirror the input's: same names, every tensor where its qweight was
    assert sorted(f.name for f in dst.glob("*.safetensors")) == sorted(
        f.name for f in src.glob("*.safetensors"))
    src_ckpt = ck.open_checkpoint(src)
    for f in dst.glob("*.safetensors"):
        for name in read_all(f):
            source = name[: -len(".weight")] + ".qweight"
            source = source if source in src_ckpt.tensors else name
            assert src_ckpt.tensors[source].file == f.name
    if shards > 1:
        index = json.loads((dst / "model.safetensors.index.json").read_text())
        assert index["metadata"]["total_size"] == sum(a.nbytes for a in got.values())
        assert set(index["weight_map"]) == set(got)
        for name, file in index["weight_map"].items():
            assert name in header(dst / file)
    else:
        assert not (dst / "model.safetensors.index.json").exists()


def test_config_and_other_files(tmp_path, tensors):
    src = write_checkpoint(tmp_path / "src", tensors)
    cv.convert(src, tmp_path / "dst", dtype="bfloat16")
    dst = tmp_path / "dst"
    config = json.loads((dst / "config.json").read_text())
    expected = model_config()
    del expected["quantization_config"]
    expected["torch_dtype"] = "bfloat16"
    assert config == expected
    for name in ("tokenizer.json", "generation_config.json", "1_Pooling/config.json"):
        assert (dst / name).read_bytes() == (src / name).read_bytes()
    # stale quantized weights and hidden folders stay behind
    assert not (dst / "pytorch_model.bin").exists() and not (dst / ".git").exists()
    # DST gets the permissions of any new folder, not a temporary folder's 0700
    os.mkdir(tmp_path / "plain")
    assert dst.stat().st_mode == (tmp_path / "plain").stat().st_mode


def test_headers_are_aligned_and_carry_the_format(tmp_path, tensors):
    src = write_checkpoint(tmp_path / "src", tensors)
    cv.convert(src, tmp_path / "dst")
    path = tmp_path / "dst" / "model.safetensors"
    h = header(path)
    assert h.pop("__metadata__")["format"] == "pt"
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
    assert (8 + n) % 8 == 0
    size = {"F16": 2, "BF16": 2, "F32": 4, "I32": 4, "I64": 8, "U32": 4}
    ends = sorted(v["data_offsets"] for v in h.values())
    assert ends[0][0] == 0 and all(a[1] == b[0] for a, b in zip(ends, ends[1:]))
    assert 8 + n + ends[-1][1] == path.stat().st_size
    for v in h.values():
        assert v["data_offsets"][0] % size[v["dtype"]] == 0


@pytest.mark.parametrize("layout", ["linear", "awq"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_dtypes_and_layouts(tmp_path, tensors, dtype, layout):
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    src = write_checkpoint(tmp_path / "src", tensors, extra=False)
    stats = cv.convert(src, tmp_path / "dst", dtype=dtype, layout=layout)
    assert (stats.dtype, stats.layout) == (dtype, layout)
    got = converted(tmp_path / "dst")
    check_against_reference(tensors, got, dtype, layout)
    h = header(tmp_path / "dst" / "model.safetensors")
    assert h["model.layers.0.mlp.up_proj.weight"]["dtype"] == CODES[dtype]
    assert h["model.layers.0.mlp.up_proj.weight"]["shape"] == ([96, 64] if layout == "linear"
                                                               else [64, 96])


def test_bfloat16_scales_default_to_bfloat16(tmp_path, rng):
    pytest.importorskip("ml_dtypes")
    t = make_tensors(rng, scale_dtype="bfloat16", word_dtype=np.uint32)
    stats = cv.convert(write_checkpoint(tmp_path / "src", t), tmp_path / "dst")
    assert stats.dtype == "bfloat16"
    check_against_reference(t, converted(tmp_path / "dst"), "bfloat16")
    assert json.loads((tmp_path / "dst" / "config.json").read_text())["torch_dtype"] == "bfloat16"


def test_per_channel_checkpoint(tmp_path, rng):
    t = make_tensors(rng, group_size=-1)
    src = write_checkpoint(tmp_path / "src", t, config=model_config(group_size=-1))
    cv.convert(src, tmp_path / "dst")
    got = converted(tmp_path / "dst")
    for p in layer_prefixes(t):
        qw, qz, sc = (t[f"{p}.{x}"] for x in ("qweight", "qzeros", "scales"))
        reference.assert_bitexact(got[p + ".weight"].T, reference.dequantize(qw, qz, sc))


def test_single_safetensors_file(tmp_path, tensors):
    src = write_checkpoint(tmp_path / "src", tensors, config=None, extra=False)
    cv.convert(src / "model.safetensors", tmp_path / "dst")
    assert sorted(p.name for p in (tmp_path / "dst").iterdir()) == ["model.safetensors"]
    check_against_reference(tensors, converted(tmp_path / "dst"))
    cv.convert(src / "model.safetensors", tmp_path / "dst2", group_size=G)
    assert (tmp_path / "dst2" / "model.safetensors").read_bytes() == (
        tmp_path / "dst" / "model.safetensors").read_bytes()


def test_empty_destination_folder_and_overwrite(tmp_path, tensors):
    src = write_checkpoint(tmp_path / "src", tensors)
    dst = tmp_path / "dst"
    dst.mkdir()
    cv.convert(src, dst)  # an empty DST is fine
    (dst / "old.txt").write_text("from before")
    cv.convert(src, dst, dtype="float32", overwrite=True)
    assert not (dst / "old.txt").exists()
    check_against_reference(tensors, converted(dst), "float32")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_parents_of_dst_are_created(tmp_path, tensors):
    src = write_checkpoint(tmp_path / "src", tensors, extra=False)
    cv.convert(src, tmp_path / "a" / "b" / "dst")
    check_against_reference(tensors, converted(tmp_path / "a" / "b" / "dst"))


def test_peak_memory_stays_near_the_largest_layer(tmp_path, rng):
    # 12 layers of 256 x 1024: about 0.5 MB dense each, 6 MB in all.
    t = {}
    for i in range(12):
        qw, qz, sc = awq.quantize(rng.standard_normal((256, 1024)).astype(np.float16), G)
        t[f"l{i:02d}.qweight"], t[f"l{i:02d}.qzeros"], t[f"l{i:02d}.scales"] = qw, qz, sc
    src = write_checkpoint(tmp_path / "src", t, extra=False)
    layer = 256 * 1024 * 2
    del t, qw, qz, sc
    tracemalloc.start()
    try:
        cv.convert(src, tmp_path / "dst")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    print(f"peak {peak} bytes, {peak / layer:.2f} layers")
    assert peak < 5 * layer, f"peak {peak} bytes for layers of {layer} bytes"
    assert len(converted(tmp_path / "dst")) == 12


# ---------------------------------------------------------------------------- bad input

def _refused(tmp_path, src, error, words, dst=None, **kw):
    dst = dst or tmp_path / "dst"
    with pytest.raises(error, match=words) as info:
        cv.convert(src, dst, **kw)
    assert isinstance(info.value, ValueError)
    return info.value


@pytest.mark.parametrize("edit, error, words", [
    (lambda s: (s / "config.json").unlink(), ck.CheckpointFileError, "no config.json"),
    (lambda s: (s / "model.safetensors").unlink(), ck.CheckpointFileError, "no model.safetensors"),
    (lambda s: (s / "config.json").write_text(json.dumps(
        {k: v for k, v in model_config().items() if k != "quantization_config"})),
     ck.NotAWQCheckpointError, "no quantization_config"),
    (lambda s: (s / "config.json").write_text(json.dumps(model_config(quant_method="gptq"))),
     ck.NotAWQCheckpointError, "'gptq'"),
    (lambda s: (s / "config.json").write_text(json.dumps(model_config(bits=8))),
     ck.UnsupportedCheckpointError, "bits is 8"),
    (lambda s: (s / "config.json").write_text(json.dumps(model_config(version="gemv"))),
     ck.UnsupportedCheckpointError, "'gemv'"),
    (lambda s: (s / "config.json").write_text(json.dumps(model_config(version="marlin"))),
     ck.UnsupportedCheckpointError, "'marlin'"),
    (lambda s: (s / "config.json").write_text(json.dumps(model_config(version="exllama"))),
     ck.UnsupportedCheckpointError, "'exllama'"),
    (lambda s: (s / "config.json").write_text(json.dumps(model_config(group_size=64))),
     ck.LayerShapeError, "not a multiple of group_size 64"),
    (lambda s: (s / "config.json").write_text(json.dumps(model_config(group_size=16))),
     ck.LayerShapeError, r"expected \[K/G, N/8\]"),
])
def test_bad_checkpoint_writes_nothing(tmp_path, tensors, edit, error, words):
    src = write_checkpoint(tmp_path / "src", tensors)
    edit(src)
    _refused(tmp_path, src, error, words)
    assert_nothing_left(tmp_path, tmp_path / "dst")


def test_bad_shapes_write_nothing(tmp_path, tensors):
    tensors["model.layers.0.mlp.up_proj.scales"] = np.ones((3, 96), np.float16)
    _refused(tmp_path, write_checkpoint(tmp_path / "src", tensors), ck.LayerShapeError,
             r"model.layers.0.mlp.up_proj.*scales has shape \[3, 96\]")
    assert_nothing_left(tmp_path, tmp_path / "dst")


def test_scaled_activations_write_nothing(tmp_path, tensors):
    """A dense checkpoint has no place for AutoAWQ's activation scales: transformers
    would load it without them and compute wrong outputs."""
    tensors["model.layers.0.mlp.act.scales"] = np.full(96, 2.0, np.float16)
    _refused(tmp_path, write_checkpoint(tmp_path / "src", tensors), cv.ConvertError,
             r"holds AutoAWQ's scaled activations \(model.layers.0.mlp.act.scales\).*"
             r"load_pretrained")
    assert_nothing_left(tmp_path, tmp_path / "dst")


def test_missing_shard_writes_nothing(tmp_path, tensors):
    src = write_checkpoint(tmp_path / "src", tensors, shards=2)
    (src / "model-00001-of-00002.safetensors").unlink()
    _refused(tmp_path, src, ck.CheckpointFileError, "missing")
    assert_nothing_left(tmp_path, tmp_path / "dst")


def test_missing_src(tmp_path):
    _refused(tmp_path, tmp_path / "nothing", ck.CheckpointFileError, "no such file")
    assert_nothing_left(tmp_path, tmp_path / "dst")


def test_single_file_with_ambiguous_group_size_writes_nothing(tmp_path, rng):
    t = make_tensors(rng, group_size=-1)
    src = write_checkpoint(tmp_path / "src", t, config=None, extra=False)
    _refused(tmp_path, src / "model.safetensors", ck.CheckpointError, "pass the group size")
    assert_nothing_left(tmp_path, tmp_path / "dst")


def test_non_empty_dst_is_kept(tmp_path, tensors):
    src = write_checkpoint(tmp_path / "src", tensors)
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "mine.txt").write_text("keep me")
    _refused(tmp_path, src, cv.ConvertError, "not empty; pass --overwrite")
    assert [p.name for p in dst.iterdir()] == ["mine.txt"]
    assert (dst / "mine.txt").read_text() == "keep me"


def test_dst_that_is_a_file(tmp_path, tensors):
    src = write_checkpoint(tmp_path / "src", tensors)
    (tmp_path / "dst").write_text("a file")
    _refused(tmp_path, src, cv.ConvertError, "not a folder", overwrite=True)
    assert (tmp_path / "dst").read_text() == "a file"


@pytest.mark.parametrize("where", ["inside", "same", "parent"])
def test_dst_overlapping_src(tmp_path, tensors, where):
    src = write_checkpoint(tmp_path / "m" / "src", tensors)
    dst = {"inside": src / "dense", "same": src, "parent": tmp_path / "m"}[where]
    _refused(tmp_path, src, cv.ConvertError, "SRC", dst=dst, overwrite=True)
    assert ck.open_checkpoint(src).layers and not (src / "dense").exists()


@pytest.mark.parametrize("kw, words", [
    ({"dtype": "float64"}, "dtype must be one of"),
    ({"layout": "transposed"}, "layout must be"),
    ({"device": "gpu"}, "device must be"),
    ({"device": "cuda:x"}, "device must be"),
])
def test_bad_options(tmp_path, tensors, kw, words):
    _refused(tmp_path, write_checkpoint(tmp_path / "src", tensors), cv.ConvertError, words, **kw)
    assert_nothing_left(tmp_path, tmp_path / "dst")


@pytest.mark.skipif(awq.cuda_available(), reason="checks the refusal without a usable GPU")
def test_cuda_without_a_gpu(tmp_path, tensors):
    _refused(tmp_path, write_checkpoint(tmp_path / "src", tensors), cv.ConvertError,
             "no usable CUDA device", device="cuda")
    assert_nothing_left(tmp_path, tmp_path / "dst")


# ---------------------------------------------------------------------------- failures midway

def _fail_on_call(n, exc):
    """A dequantize that works n - 1 times, then raises exc."""
    real, calls = awq.dequantize, [0]

    def dequantize(*args, **kw):
        calls[0] += 1
        if calls[0] >= n:
            raise exc
        return real(*args, **kw)

    return dequantize, calls


@pytest.mark.parametrize("exc", [RuntimeError("disk on fire"), KeyboardInterrupt()])
@pytest.mark.parametrize("shards", [1, 2])
def test_failure_after_the_first_layer_leaves_no_dst(tmp_path, tensors, monkeypatch, exc, shards):
    src = write_checkpoint(tmp_path / "src", tensors, shards=shards)
    fake, calls = _fail_on_call(2, exc)
    monkeypatch.setattr(awq, "dequantize", fake)
    with pytest.raises(type(exc)):
        cv.convert(src, tmp_path / "dst")
    assert calls[0] == 2
    assert_nothing_left(tmp_path, tmp_path / "dst")


def test_failure_while_writing_leaves_no_dst(tmp_path, tensors, monkeypatch):
    src = write_checkpoint(tmp_path / "src", tensors)
    real, calls = cv.SafetensorsWriter.write, [0]

    def write(self, name, data):
        calls[0] += 1
        if calls[0] == 3:
            raise OSError(28, "No space left on device")
        return real(self, name, data)

    monkeypatch.setattr(cv.SafetensorsWriter, "write", write)
    with pytest.raises(OSError, match="No space left"):
        cv.convert(src, tmp_path / "dst")
    assert_nothing_left(tmp_path, tmp_path / "dst")


def test_failure_keeps_the_dst_being_overwritten(tmp_path, tensors, monkeypatch):
    src = write_checkpoint(tmp_path / "src", tensors)
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "mine.txt").write_text("keep me")
    monkeypatch.setattr(awq, "dequantize", _fail_on_call(2, KeyboardInterrupt())[0])
    with pytest.raises(KeyboardInterrupt):
        cv.convert(src, dst, overwrite=True)
    assert [p.name for p in dst.iterdir()] == ["mine.txt"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_failure_copying_files_leaves_no_dst(tmp_path, tensors, monkeypatch):
    src = write_checkpoint(tmp_path / "src", tensors)

    def copy2(*a, **kw):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(cv.shutil, "copy2", copy2)
    with pytest.raises(PermissionError):
        cv.convert(src, tmp_path / "dst")
    assert_nothing_left(tmp_path, tmp_path / "dst")


# ---------------------------------------------------------------------------- copies

@pytest.mark.parametrize("how", ["no copy_file_range", "EXDEV"])
def test_byte_copies_without_copy_file_range(tmp_path, tensors, monkeypatch, how):
    if how == "EXDEV":
        def refuse(*a):
            raise OSError(18, "Invalid cross-device link")
        monkeypatch.setattr(cv.os, "copy_file_range", refuse, raising=False)
    else:
        monkeypatch.delattr(cv.os, "copy_file_range", raising=False)
    monkeypatch.setattr(cv, "_COPY_CHUNK", 64)  # many chunks per tensor
    src = write_checkpoint(tmp_path / "src", tensors, shards=2)
    cv.convert(src, tmp_path / "dst")
    check_against_reference(tensors, converted(tmp_path / "dst"))


@pytest.mark.parametrize("platform", ["linux", "darwin"])
def test_writeback_after_every_tensor(tmp_path, tensors, monkeypatch, platform):
    # posix_fadvise on Linux, fdatasync elsewhere: the bytes must not change.
    calls = []
    monkeypatch.setattr(cv, "_SYNC_BYTES", 1)
    monkeypatch.setattr(cv.sys, "platform", platform)
    for name in ("posix_fadvise", "fdatasync"):
        real = getattr(cv.os, name, None)
        if real is not None:
            monkeypatch.setattr(cv.os, name, lambda *a, _real=real, _name=name: (
                calls.append(_name), _real(*a))[1])
    src = write_checkpoint(tmp_path / "src", tensors, shards=2)
    cv.convert(src, tmp_path / "dst")
    check_against_reference(tensors, converted(tmp_path / "dst"))
    expected = "posix_fadvise" if platform == "linux" else "fdatasync"
    assert calls.count(expected) >= len(tensors) // 3 and set(calls) == {expected}


def test_copy_range_refuses_a_short_source(tmp_path):
    (tmp_path / "src.bin").write_bytes(b"0123456789")
    w = cv.SafetensorsWriter(tmp_path / "x.safetensors", [("a", "U8", (8,))])
    with pytest.raises(OSError, match="unexpected end of file"):
        w.copy_range("a", tmp_path / "src.bin", 4, 8)
    w.abort()


def test_convert_bench_script_runs(tmp_path, capsys):
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "..", "scripts", "convert_bench.py")
    spec = importlib.util.spec_from_file_location("convert_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out_json = tmp_path / "bench.json"
    assert bench.main(["--layers", "1", "--vocab", "64", "--shard-gb", "0.05", "--dir",
                       str(tmp_path), "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "ratio to the plain copy" in out and "% of the time in dequantize" in out
    result = json.loads(out_json.read_text())
    assert result["runs"][0]["bytes_written"] > 7 * 4096 * 1024 * 2
    assert [p.name for p in tmp_path.iterdir()] == ["bench.json"]  # temporary files removed


# ---------------------------------------------------------------------------- writer

def test_writer_refuses_out_of_order_or_missing_tensors(tmp_path):
    w = cv.SafetensorsWriter(tmp_path / "x.safetensors", [("a", "F16", (2,)), ("b", "I32", (1,))])
    with pytest.raises(ValueError, match="expected tensor a"):
        w.write("b", np.zeros(1, np.int32))
    with pytest.raises(ValueError, match="4 bytes"):
        w.write("a", np.zeros(1, np.float32).view(np.uint8)[:3])
    w.write("a", np.array([1, 2], np.float16))
    with pytest.raises(ValueError, match="1 of 2 tensors"):
        w.finish()
    w.write("b", np.array([7], np.int32))
    w.finish()
    got = read_all(tmp_path / "x.safetensors")
    assert got["a"].tolist() == [1, 2] and got["b"].tolist() == [7]


# ---------------------------------------------------------------------------- command line

def test_cli_convert_prints_a_summary(tmp_path, tensors, capsys):
    src = write_checkpoint(tmp_path / "src", tensors, shards=2)
    assert main(["convert", str(src), str(tmp_path / "dst"), "--dtype", "float32",
                 "--layout", "awq", "--no-progress"]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("converted 10 layers to float32 (awq layout) on cpu, copied")
    assert "GB/s" in out.out and "dequantize" in out.out
    assert "not copied" in out.err and "pytorch_model.bin" in out.err
    check_against_reference(tensors, converted(tmp_path / "dst"), "float32", "awq")


def test_cli_convert_shows_progress(tmp_path, tensors, capsys):
    pytest.importorskip("tqdm")
    src = write_checkpoint(tmp_path / "src", tensors, extra=False)
    assert main(["convert", str(src), str(tmp_path / "dst")]) == 0
    assert "layers 10/10" in capsys.readouterr().err


def test_cli_convert_error_is_one_line(tmp_path, tensors, capsys):
    src = write_checkpoint(tmp_path / "src", tensors)
    (src / "config.json").write_text(json.dumps(model_config(version="gemv")))
    assert main(["convert", str(src), str(tmp_path / "dst"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "convert: error:" in err and "'gemv'" in err and "Traceback" not in err
    assert_nothing_left(tmp_path, tmp_path / "dst")


def test_cli_help_states_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # undo argparse's line wrapping
    for words in ("default: cpu", "default: linear", "default: the scales' dtype",
                  "--overwrite", "--group-size"):
        assert words in out


# ---------------------------------------------------------------------------- GPU

@pytest.mark.parametrize("dtype, layout, words", [("float16", "linear", np.int32),
                                                  ("bfloat16", "awq", np.uint32),
                                                  ("float32", "linear", np.uint32)])
def test_torch_backend_on_cpu_tensors_equals_numpy(tmp_path, rng, monkeypatch, dtype, layout,
                                                   words):
    # The --device cuda path (safetensors' torch reader, torch dequantize, the
    # transposition and host buffers), run on CPU tensors so that it is checked
    # without a GPU.
    torch = pytest.importorskip("torch")
    pytest.importorskip("ml_dtypes")
    t = make_tensors(rng, word_dtype=words)
    src = write_checkpoint(tmp_path / "src", t, shards=2)
    numpy_stats = cv.convert(src, tmp_path / "numpy", dtype=dtype, layout=layout)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(cv, "_backend", lambda device, dtype, layout, ckpt: cv._TorchBackend(
        dtype, layout, torch.device("cpu"), cv._max_dense_bytes(ckpt, dtype)))
    torch_stats = cv.convert(src, tmp_path / "torch", dtype=dtype, layout=layout)
    assert torch_stats.bytes_written == numpy_stats.bytes_written
    for f in sorted(p for p in (tmp_path / "numpy").iterdir() if p.is_file()):
        assert (tmp_path / "torch" / f.name).read_bytes() == f.read_bytes(), f.name


@pytest.mark.gpu
@pytest.mark.skipif(not awq.cuda_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype, layout", [("float16", "linear"), ("bfloat16", "awq"),
                                           ("float32", "linear")])
def test_cuda_conversion_equals_cpu(tmp_path, tensors, dtype, layout):
    pytest.importorskip("torch")
    src = write_checkpoint(tmp_path / "src", tensors, shards=2)
    gpu = cv.convert(src, tmp_path / "gpu", dtype=dtype, layout=layout, device="cuda")
    cpu = cv.convert(src, tmp_path / "cpu", dtype=dtype, layout=layout)
    assert gpu.device == "cuda" and gpu.bytes_written == cpu.bytes_written
    # The same files; tensors the same bits, NaN payloads aside (the contract
    # lets the CPU and the GPU spell a NaN differently).
    from safetensors.torch import load_file as load_torch
    torch = pytest.importorskip("torch")
    for f in sorted(p for p in (tmp_path / "cpu").iterdir() if p.is_file()):
        g = tmp_path / "gpu" / f.name
        if f.suffix != ".safetensors":
            assert g.read_bytes() == f.read_bytes(), f.name
            continue
        want, got = load_torch(str(f)), load_torch(str(g))
        assert sorted(want) == sorted(got), f.name
        for name, t in want.items():
            if t.is_floating_point():
                reference.assert_bitexact(got[name], t)
            else:
                assert torch.equal(got[name], t), name
