"""Synthetic AWQ checkpoints for the checkpoint, convert and inspect tests.

Written with safetensors' own writer, so the package's reader and writer are
both checked against the library rather than against each other."""

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import make_problem

safetensors_numpy = pytest.importorskip("safetensors.numpy", reason="needs safetensors")

G = 32
# (name, K, N) of each quantized linear layer of one block: N = 8 is the
# narrowest layer, K = G a single group.
BLOCK_LINEARS = (("self_attn.q_proj", 64, 64), ("self_attn.k_proj", 64, 8),
                 ("mlp.up_proj", 64, 96), ("mlp.down_proj", 96, 64), ("mlp.gate", G, 24))


def awq_config(**changes) -> dict:
    qc = {"quant_method": "awq", "bits": 4, "group_size": G, "zero_point": True,
          "version": "gemm", "modules_to_not_convert": None}
    qc.update(changes)
    return qc


def model_config(**quant_changes) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "model_type": "llama",
            "torch_dtype": "float16", "quantization_config": awq_config(**quant_changes)}


def make_tensors(rng, blocks=2, group_size=G, scale_dtype="float16", word_dtype=np.int32,
                 specials=True) -> dict:
    """Tensors of a small AWQ model: `blocks` blocks of quantized linears (random
    words, scales with NaN/Inf/0 among them) plus norms, biases, an int64
    buffer, embeddings and a dense head."""
    t = {}
    for b in range(blocks):
        for name, K, N in BLOCK_LINEARS:
            Gl = K if group_size == -1 else group_size
            qw, qz, sc = make_problem(rng, K, N, Gl, scale_dtype, word_dtype, specials)
            p = f"model.layers.{b}.{name}"
            t[p + ".qweight"], t[p + ".qzeros"], t[p + ".scales"] = qw, qz, sc
        t[f"model.layers.{b}.input_layernorm.weight"] = rng.standard_normal(64).astype(np.float16)
        t[f"model.layers.{b}.self_attn.q_proj.bias"] = rng.standard_normal(64).astype(np.float32)
    t["model.embed_tokens.weight"] = rng.standard_normal((50, 64)).astype(np.float16)
    t["model.position_ids"] = np.arange(7, dtype=np.int64).reshape(1, 7)
    t["model.norm.weight"] = np.ones(64, dtype=np.float16)
    t["lm_head.weight"] = rng.standard_normal((50, 64)).astype(np.float16)
    return t


def layer_prefixes(tensors: dict) -> list:
    return sorted(n[: -len(".qweight")] for n in tensors if n.endswith(".qweight"))


def write_checkpoint(folder, tensors: dict, *, config="default", shards=1, extra=True) -> Path:
    """A checkpoint folder: config.json, the tensors in `shards` files (with an
    index when more than one), and, with extra, the files a real checkpoint
    carries (tokenizer, generation config, a subfolder), a stale .bin weight
    file and a hidden folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if config == "default":
        config = model_config()
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config, indent=2))
    names = sorted(tensors)
    if shards == 1:
        safetensors_numpy.save_file(tensors, str(folder / "model.safetensors"),
                                    metadata={"format": "pt"})
    else:
        weight_map = {}
        for i in range(shards):
            file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: tensors[n] for n in names[i::shards]}
            safetensors_numpy.save_file(part, str(folder / file), metadata={"format": "pt"})
            weight_map.update({n: file for n in part})
        (folder / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": sum(a.nbytes for a in tensors.values())},
             "weight_map": weight_map}, indent=2))
    if extra:
        (folder / "tokenizer.json").write_text('{"version": "1.0"}')
        (folder / "generation_config.json").write_text('{"do_sample": false}')
        (folder / "1_Pooling").mkdir()
        (folder / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
        (folder / "pytorch_model.bin").write_bytes(b"stale quantized weights")
        (folder / ".git").mkdir()
        (folder / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    return folder


def read_all(path) -> dict:
    """Every tensor of a safetensors file as NumPy (bfloat16 via ml_dtypes)."""
    return dict(safetensors_numpy.load_file(str(path)))
