"""Reading AWQ checkpoints (awq_fast_dequant.checkpoint): configuration, shards,
layer discovery and shape validation, lazy tensor reads.  Skipped without safetensors."""

import json

import numpy as np
import pytest

pytest.importorskip("safetensors", reason="reading checkpoints needs safetensors")

from awq_fast_dequant import checkpoint as ck  # noqa: E402
from awq_fast_dequant.convert import SafetensorsWriter  # noqa: E402

from checkpoint_helpers import (  # noqa: E402
    G, awq_config, layer_prefixes, make_tensors, model_config, write_checkpoint)


@pytest.fixture
def tensors(rng):
    return make_tensors(rng)


# ---------------------------------------------------------------------------- configuration

def test_config_accepts_hugging_face_keys():
    cfg = ck.AWQConfig.from_dict(awq_config(group_size=128, modules_to_not_convert=["lm_head"]))
    assert (cfg.bits, cfg.group_size, cfg.zero_point, cfg.version) == (4, 128, True, "gemm")
    assert cfg.modules_to_not_convert == ("lm_head",)
    assert ck.AWQConfig.from_dict(cfg.to_dict()) == cfg


def test_config_accepts_autoawq_keys_and_upper_case_version():
    cfg = ck.AWQConfig.from_dict({"zero_point": True, "q_group_size": 64, "w_bit": 4,
                                  "version": "GEMM"}, source="x/quant_config.json")
    assert (cfg.bits, cfg.group_size, cfg.version) == (4, 64, "gemm")


def test_config_defaults_zero_point_and_version_as_hugging_face_does():
    cfg = ck.AWQConfig.from_dict({"quant_method": "awq", "bits": 4, "group_size": -1})
    assert (cfg.group_size, cfg.zero_point, cfg.version) == (-1, True, "gemm")


def test_config_reads_the_format_key_of_transformers_5():
    # transformers 5 writes the layout as "format" (and "version" alike); "version"
    # alone is the older form, "format" alone the newer
    base = {"quant_method": "awq", "bits": 4, "group_size": 128}
    for keys in ({"format": "gemm"}, {"format": "GEMM", "version": "gemm"},
                 {"backend": "autoawq", "format": "gemm"}):
        assert ck.AWQConfig.from_dict({**base, **keys}).version == "gemm"
    for keys, words in (({"format": "gemv"}, "'gemv'.*matrix-vector"),
                        ({"format": "gemv_fast", "version": None}, "'gemv_fast'"),
                        ({"backend": "llm-awq", "version": "gemm"}, "'llm-awq'.*llm-awq"),
                        ({"format": "gemv", "version": "gemm"}, "disagree")):
        with pytest.raises(ck.UnsupportedCheckpointError, match=words):
            ck.AWQConfig.from_dict({**base, **keys})


@pytest.mark.parametrize("changes, error, words", [
    ({"quant_method": "gptq"}, ck.NotAWQCheckpointError, "'gptq'"),
    ({"quant_method": None}, ck.NotAWQCheckpointError, "quant_method"),
    ({"bits": 8}, ck.UnsupportedCheckpointError, "bits is 8"),
    ({"bits": None}, ck.UnsupportedCheckpointError, "'bits'"),
    ({"version": "gemv"}, ck.UnsupportedCheckpointError, "'gemv'"),
    ({"version": "gemv_fast"}, ck.UnsupportedCheckpointError, "'gemv_fast'"),
    ({"version": "marlin"}, ck.UnsupportedCheckpointError, "Marlin"),
    ({"version": "exllama"}, ck.UnsupportedCheckpointError, "ExLlama"),
    ({"zero_point": False}, ck.UnsupportedCheckpointError, "zero_point"),
    ({"group_size": 0}, ck.UnsupportedCheckpointError, "group_size"),
    ({"group_size": "128"}, ck.UnsupportedCheckpointError, "group_size"),
    ({"group_size": True}, ck.UnsupportedCheckpointError, "group_size"),
    ({"modules_to_not_convert": "lm_head"}, ck.UnsupportedCheckpointError, "modules_to_not"),
])
def test_config_rejects(changes, error, words):
    qc = awq_config(**changes)
    qc = {k: v for k, v in qc.items() if v is not None or k == "modules_to_not_convert"}
    with pytest.raises(error, match=words) as info:
        ck.AWQConfig.from_dict(qc)
    assert isinstance(info.value, ValueError)


# ---------------------------------------------------------------------------- opening

@pytest.mark.parametrize("shards", [1, 3])
def test_open_lists_layers_and_other_tensors(tmp_path, tensors, shards):
    src = write_checkpoint(tmp_path / "src", tensors, shards=shards)
    c = ck.open_checkpoint(src)
    assert c.sharded == (shards > 1) and len(c.files) == shards
    assert [layer.prefix for layer in c.layers] == layer_prefixes(tensors)
    for layer in c.layers:
        qw = tensors[layer.prefix + ".qweight"]
        assert (layer.in_features, layer.out_features) == (qw.shape[0], 8 * qw.shape[1])
        assert layer.group_size == G and layer.scales_dtype == "float16"
        assert layer.weight_name == layer.prefix + ".weight"
        assert layer.file == c.tensors[layer.prefix + ".qweight"].file
    quantized = {n for n in tensors if n.rsplit(".", 1)[1] in ("qweight", "qzeros", "scales")}
    assert {t.name for t in c.others} == set(tensors) - quantized
    for name, arr in tensors.items():
        info = c.tensors[name]
        assert info.shape == arr.shape and info.nbytes == arr.nbytes
    assert c.quant.group_size == G and c.config["model_type"] == "llama"
    assert "config.json" in c.own_files and set(c.files) <= c.own_files


def test_reader_returns_the_stored_tensors(tmp_path, tensors):
    src = write_checkpoint(tmp_path / "src", tensors, shards=2)
    c = ck.open_checkpoint(src)
    with c.open_tensors("numpy") as r:
        for name, arr in tensors.items():
            got = r.get(name)
            assert got.dtype == arr.dtype and np.array_equal(got.view(np.uint8),
                                                             arr.view(np.uint8))
        with pytest.raises(KeyError, match="nope"):
            r.get("nope")


def test_reader_gives_torch_tensors(tmp_path, tensors):
    torch = pytest.importorskip("torch")
    src = write_checkpoint(tmp_path / "src", tensors)
    with ck.open_checkpoint(src).open_tensors("pt") as r:
        got = r.get("model.layers.0.mlp.up_proj.qweight")
    assert isinstance(got, torch.Tensor)
    assert np.array_equal(got.numpy(), tensors["model.layers.0.mlp.up_proj.qweight"])


def test_bfloat16_scales_and_uint32_words(tmp_path, rng):
    pytest.importorskip("ml_dtypes")
    t = make_tensors(rng, blocks=1, scale_dtype="bfloat16", word_dtype=np.uint32)
    c = ck.open_checkpoint(write_checkpoint(tmp_path / "src", t))
    assert {layer.scales_dtype for layer in c.layers} == {"bfloat16"}
    assert {layer.qweight.dtype for layer in c.layers} == {"U32"}


def test_per_channel_group_size(tmp_path, rng):
    t = make_tensors(rng, group_size=-1)
    c = ck.open_checkpoint(write_checkpoint(tmp_path / "src", t,
                                            config=model_config(group_size=-1)))
    assert all(layer.group_size == layer.in_features for layer in c.layers)


def test_autoawq_quant_config_json(tmp_path, tensors):
    config = model_config()
    del config["quantization_config"]
    src = write_checkpoint(tmp_path / "src", tensors, config=config)
    (src / "quant_config.json").write_text(json.dumps(
        {"zero_point": True, "q_group_size": G, "w_bit": 4, "version": "GEMM"}))
    c = ck.open_checkpoint(src)
    assert c.quant.group_size == G and "quant_config.json" in c.own_files


def test_lone_scales_tensor_is_an_ordinary_tensor(tmp_path, tensors):
    # AutoAWQ's scaled activations store a 1-D "<module>.scales" with no qweight.
    tensors["model.layers.0.mlp.act.scales"] = np.ones(96, np.float16)
    c = ck.open_checkpoint(write_checkpoint(tmp_path / "src", tensors))
    assert "model.layers.0.mlp.act.scales" in {t.name for t in c.others}


def test_single_file_infers_or_takes_the_group_size(tmp_path, tensors):
    src = write_checkpoint(tmp_path / "src", tensors, config=None, extra=False)
    file = src / "model.safetensors"
    assert ck.open_checkpoint(file).quant.group_size == G
    assert ck.open_checkpoint(file, group_size=G).config is None
    with pytest.raises(ck.LayerShapeError, match="not a multiple of group_size 64"):
        ck.open_checkpoint(file, group_size=64)  # the 32-row layer


def test_single_file_with_ambiguous_group_size(tmp_path, rng):
    t = make_tensors(rng, group_size=-1)  # per channel: K/rows differs between layers
    file = write_checkpoint(tmp_path / "src", t, config=None, extra=False) / "model.safetensors"
    with pytest.raises(ck.CheckpointError, match="pass the group size"):
        ck.open_checkpoint(file)
    assert ck.open_checkpoint(file, group_size=-1).layers[0].group_size > 0


def test_open_safetensors_reads_any_dense_checkpoint(tmp_path, tensors):
    src = write_checkpoint(tmp_path / "src", tensors, shards=2)
    folder, infos = ck.open_safetensors(src)
    assert folder == src and set(infos) == set(tensors)
    with ck.TensorReader(folder, infos) as r:
        assert np.array_equal(r.get("lm_head.weight"), tensors["lm_head.weight"])


# ---------------------------------------------------------------------------- rejections

def _expect(error, words, src, **kw):
    with pytest.raises(error, match=words) as info:
        ck.open_checkpoint(src, **kw)
    assert isinstance(info.value, ck.CheckpointError)
    return info.value


def test_missing_path(tmp_path):
    _expect(ck.CheckpointFileError, "no such file", tmp_path / "nothing")


def test_folder_without_config(tmp_path, tensors):
    _expect(ck.CheckpointFileError, "no config.json",
            write_checkpoint(tmp_path / "src", tensors, config=None))


def test_config_without_quantization_config(tmp_path, tensors):
    config = model_config()
    del config["quantization_config"]
    _expect(ck.NotAWQCheckpointError, "no quantization_config",
            write_checkpoint(tmp_path / "src", tensors, config=config))


def test_config_not_json(tmp_path, tensors):
    src = write_checkpoint(tmp_path / "src", tensors)
    (src / "config.json").write_text("{not json")
    _expect(ck.CheckpointFileError, "not valid JSON", src)


def test_folder_without_weights(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(model_config()))
    (src / "pytorch_model.bin").write_bytes(b"x")
    _expect(ck.CheckpointFileError, "only safetensors", src)


def test_folder_with_another_safetensors_name(tmp_path, tensors):
    src = write_checkpoint(tmp_path / "src", tensors)
    (src / "model.safetensors").rename(src / "awq.safetensors")
    _expect(ck.CheckpointFileError, "pass the file itself", src)


def test_not_a_safetensors_file(tmp_path, tensors):
    src = write_checkpoint(tmp_path / "src", tensors)
    (src / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{broken")
    _expect(ck.CheckpointFileError, "cannot be read as safetensors", src)


def test_other_file_types(tmp_path):
    (tmp_path / "w.bin").write_bytes(b"x")
    _expect(ck.CheckpointFileError, "folder or a .safetensors file", tmp_path / "w.bin")


def test_index_lists_a_missing_shard(tmp_path, tensors):
    src = write_checkpoint(tmp_path / "src", tensors, shards=3)
    (src / "model-00002-of-00003.safetensors").unlink()
    _expect(ck.CheckpointFileError, "model-00002-of-00003.safetensors", src)


def test_index_disagrees_with_the_shards(tmp_path, tensors):
    src = write_checkpoint(tmp_path / "src", tensors, shards=2)
    index = json.loads((src / "model.safetensors.index.json").read_text())
    name = "model.norm.weight"
    wrong = next(f for f in set(index["weight_map"].values()) if f != index["weight_map"][name])
    index["weight_map"][name] = wrong
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    _expect(ck.CheckpointFileError, "model.norm.weight", src)
    del index["weight_map"][name]
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    _expect(ck.CheckpointFileError, "does not list", src)


def test_no_quantized_layer(tmp_path, rng):
    src = write_checkpoint(tmp_path / "src", {"w.weight": np.ones((8, 8), np.float16)})
    _expect(ck.NotAWQCheckpointError, "no quantized layer", src)


def test_group_size_argument_disagrees_with_config(tmp_path, tensors):
    _expect(ck.CheckpointError, "disagrees", write_checkpoint(tmp_path / "src", tensors),
            group_size=128)


PREFIX = "model.layers.1.mlp.up_proj"  # K = 64, N = 96


@pytest.mark.parametrize("part, value, words", [
    ("scales", np.ones((3, 96), np.float16), r"scales has shape \[3, 96\]; expected \[K/G, N\] "
                                             r"= \[2, 96\]"),
    ("scales", np.ones((2, 88), np.float16), r"expected \[K/G, N\] = \[2, 96\]"),
    ("qzeros", np.ones((2, 11), np.int32), r"qzeros has shape \[2, 11\]; expected \[K/G, N/8\] "
                                           r"= \[2, 12\]"),
    ("qweight", np.ones((48, 12), np.int32), "K=48 .* not a multiple of group_size 32"),
    ("qweight", np.ones((64, 12), np.float32), "dtype must be I32 or U32"),
    ("qweight", np.ones((64, 12, 1), np.int32), "must be 2-D"),
    ("scales", np.ones((2, 96), np.int32), "dtype must be F16 or BF16 or F32"),
    ("qzeros", None, "has a qweight but no qzeros"),
    ("scales", None, "has a qweight but no scales"),
    ("weight", np.ones((96, 64), np.float16), "both a qweight and a dense weight"),
])
def test_layer_shapes_are_checked(tmp_path, tensors, part, value, words):
    name = f"{PREFIX}.{part}"
    if value is None:
        del tensors[name]
    else:
        tensors[name] = value
    err = _expect(ck.LayerShapeError, words, write_checkpoint(tmp_path / "src", tensors))
    assert PREFIX in str(err)


def test_qzeros_without_qweight(tmp_path, tensors):
    del tensors[PREFIX + ".qweight"]
    _expect(ck.LayerShapeError, "no matching qweight", write_checkpoint(tmp_path / "src", tensors))


def test_numpy_reader_refuses_float8_before_reading(tmp_path, tensors):
    src = write_checkpoint(tmp_path / "src", tensors)
    w = SafetensorsWriter(src / "model.safetensors.tmp",
                          [("x.weight", "F8_E4M3", (4,))] + [
                              (n, {"float16": "F16", "float32": "F32", "int32": "I32",
                                   "int64": "I64"}[a.dtype.name], a.shape)
                              for n, a in sorted(tensors.items())])
    w.write("x.weight", np.zeros(4, np.uint8))
    for n, a in sorted(tensors.items()):
        w.write(n, a)
    w.finish()
    (src / "model.safetensors.tmp").replace(src / "model.safetensors")
    c = ck.open_checkpoint(src)
    assert c.tensors["x.weight"].dtype == "F8_E4M3"
    with pytest.raises(ck.CheckpointError, match=r"x.weight \(F8_E4M3\)"):
        c.open_tensors("numpy")
    assert c.unreadable("pt") == []

