#!/usr/bin/env python3
"""Throughput of awq-fast-dequant convert against a plain copy of the same bytes.

Generates a synthetic AWQ checkpoint (default: Llama-3-8B's shapes, 32 layers,
G = 128, float16 scales, sharded like a Hugging Face upload) in a temporary
folder, then, --repeat times:

  1. converts it with awq_fast_dequant.convert on --device;
  2. deletes the result and writes the same number of bytes, in files of the
     same sizes, from memory (each file fsync'd, as convert does): the disk's
     write rate in this run.

and prints the GB/s written by the conversion, the share of its time spent in
dequantize, and its ratio to the plain-copy rate (the medians over the
repeats). The source checkpoint is read back from the page cache when memory
allows, so the figures are about writing.

    python scripts/convert_bench.py --device cuda
    python scripts/convert_bench.py --device cpu --layers 2      # small and quick

Needs safetensors (pip install 'awq_fast_dequant[convert]'); --device cuda
needs torch and a CUDA build.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import awq_fast_dequant as awq
from awq_fast_dequant.checkpoint import DTYPE_SIZES
from awq_fast_dequant.convert import SafetensorsWriter, convert

# Llama-3-8B: hidden 4096, MLP 14336, 8 key/value heads of 128, vocabulary 128256.
HIDDEN, MLP, KV, VOCAB = 4096, 14336, 1024, 128256
LINEARS = (("self_attn.q_proj", HIDDEN, HIDDEN), ("self_attn.k_proj", HIDDEN, KV),
           ("self_attn.v_proj", HIDDEN, KV), ("self_attn.o_proj", HIDDEN, HIDDEN),
           ("mlp.gate_proj", HIDDEN, MLP), ("mlp.up_proj", HIDDEN, MLP),
           ("mlp.down_proj", MLP, HIDDEN))  # (name, K = in_features, N = out_features)


def _tensors(layers: int, vocab: int, G: int):
    """(name, dtype code, shape) of every tensor, in the order of the model."""
    out = [("model.embed_tokens.weight", "F16", (vocab, HIDDEN))]
    for i in range(layers):
        p = f"model.layers.{i}."
        for name, K, N in LINEARS:
            out += [(p + name + ".qweight", "I32", (K, N // 8)),
                    (p + name + ".qzeros", "I32", (K // G, N // 8)),
                    (p + name + ".scales", "F16", (K // G, N))]
        out += [(p + "input_layernorm.weight", "F16", (HIDDEN,)),
                (p + "post_attention_layernorm.weight", "F16", (HIDDEN,))]
    out += [("model.norm.weight", "F16", (HIDDEN,)), ("lm_head.weight", "F16", (vocab, HIDDEN))]
    return out


def _nbytes(code, shape) -> int:
    n = DTYPE_SIZES[code]
    for d in shape:
        n *= d
    return n


class _Data:
    """Random contents, one array per (dtype, shape), reused: dequantize's speed
    does not depend on the values, and generating 6 GB of random words would
    take longer than converting them."""

    def __init__(self, seed=0):
        self.rng, self.cache = np.random.default_rng(seed), {}

    def get(self, name, code, shape):
        key = (code, shape, name.endswith(".scales"))
        if key not in self.cache:
            if code == "I32":
                arr = self.rng.integers(0, 2**32, size=shape, dtype=np.uint32).view(np.int32)
            elif name.endswith(".scales"):
                arr = self.rng.uniform(1e-3, 1e-2, size=shape).astype(np.float16)
            else:  # embeddings, norms: tile a random block rather than draw every value
                flat = np.empty(int(np.prod(shape)), np.float16)
                block = (self.rng.standard_normal(min(flat.size, 1 << 22)) * 0.02).astype(
                    np.float16)
                for i in range(0, flat.size, block.size):
                    flat[i:i + block.size] = block[: flat.size - i]
                arr = flat.reshape(shape)
            self.cache[key] = arr
        return self.cache[key]


def generate(folder: Path, layers: int, vocab: int, G: int, shard_bytes: int) -> int:
    """Write the synthetic AWQ checkpoint; returns its size in bytes."""
    folder.mkdir(parents=True)
    entries = _tensors(layers, vocab, G)
    shards, current, size = [], [], 0
    for e in entries:
        if current and size + _nbytes(e[1], e[2]) > shard_bytes:
            shards.append(current)
            current, size = [], 0
        current.append(e)
        size += _nbytes(e[1], e[2])
    shards.append(current)
    data, weight_map, total = _Data(), {}, 0
    names = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    for file, part in zip(names, shards):
        part = sorted(part, key=lambda e: (-DTYPE_SIZES[e[1]], e[0]))  # aligned, as convert writes
        writer = SafetensorsWriter(folder / file, part, {"format": "pt"})
        for name, code, shape in part:
            writer.write(name, data.get(name, code, shape))
            weight_map[name] = file
        writer.finish()
        total += writer.size
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(_nbytes(c, s) for _, c, s in entries)},
                 "weight_map": weight_map}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "hidden_size": HIDDEN, "intermediate_size": MLP, "num_hidden_layers": layers,
              "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": vocab,
              "torch_dtype": "float16",
              "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": G,
                                      "zero_point": True, "version": "gemm",
                                      "modules_to_not_convert": None}}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "generation_config.json").write_text('{"bos_token_id": 128000}')
    return total


def plain_copy(folder: Path, sizes, buffer: np.ndarray) -> float:
    """Write files of `sizes` bytes from memory, fsync each; returns seconds."""
    folder.mkdir()
    view = memoryview(buffer)
    start = time.perf_counter()
    for i, size in enumerate(sizes):
        with open(folder / f"copy-{i}.bin", "xb") as f:
            left = size
            while left:
                n = min(left, len(view))
                f.write(view[:n])
                left -= n
            f.flush()
            os.fsync(f.fileno())
    seconds = time.perf_counter() - start
    shutil.rmtree(folder)
    return seconds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    ap.add_argument("--layers", type=int, default=32, help="decoder layers (default: 32, 8B)")
    ap.add_argument("--vocab", type=int, default=VOCAB, help=f"vocabulary (default: {VOCAB})")
    ap.add_argument("--group-size", type=int, default=128, help="default: 128")
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"],
                    help="output dtype (default: float16)")
    ap.add_argument("--layout", default="linear", choices=["linear", "awq"],
                    help="default: linear")
    ap.add_argument("--shard-gb", type=float, default=5.0,
                    help="shard size of the generated checkpoint (default: 5 GB, as uploads)")
    ap.add_argument("--repeat", type=int, default=1, help="conversions and copies (default: 1)")
    ap.add_argument("--dir", default=None,
                    help="folder for the temporary files (default: the system's temp folder)")
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = ap.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="awq-convert-bench-", dir=args.dir))
    try:
        src = root / "src"
        t0 = time.perf_counter()
        src_bytes = generate(src, args.layers, args.vocab, args.group_size,
                             int(args.shard_gb * 1e9))
        shards = len(list(src.glob("*.safetensors")))
        print(f"synthetic AWQ checkpoint: Llama-3-8B shapes, {args.layers} layers, "
              f"G={args.group_size}, {src_bytes / 1e9:.2f} GB in {shards} shard(s), generated "
              f"in {time.perf_counter() - t0:.1f} s under {root}")
        print(f"awq_fast_dequant {awq.__version__}; cpu threads {os.cpu_count()}; "
              f"cuda {awq.cuda_available()}")
        buffer = np.random.default_rng(1).integers(0, 256, 256 << 20, dtype=np.uint8)
        runs = []
        for r in range(args.repeat):
            dst = root / "dst"
            stats = convert(src, dst, dtype=args.dtype, device=args.device, layout=args.layout)
            sizes = [f.stat().st_size for f in sorted(dst.glob("*.safetensors"))]
            shutil.rmtree(dst)
            copy_s = plain_copy(root / "copy", sizes, buffer)
            copy_gbps = sum(sizes) / 1e9 / copy_s
            runs.append({"convert_gbps": stats.gbps, "copy_gbps": copy_gbps,
                         "ratio": stats.gbps / copy_gbps, "seconds": stats.seconds,
                         "bytes_written": stats.bytes_written,
                         "dequantize_share": stats.dequantize_share,
                         "read_s": stats.read_seconds, "dequantize_s": stats.dequantize_seconds,
                         "transpose_s": stats.transpose_seconds,
                         "write_wait_s": stats.write_wait_seconds, "copy_s": copy_s})
            print(f"run {r + 1}: {stats.summary()}")
            print(f"       time: read {stats.read_seconds:.2f} s, dequantize "
                  f"{stats.dequantize_seconds:.2f} s, transpose"
                  f"{' and device copies' if args.device != 'cpu' else ''} "
                  f"{stats.transpose_seconds:.2f} s, waiting for writes "
                  f"{stats.write_wait_seconds:.2f} s")
            print(f"       plain copy of the same {sum(sizes) / 1e9:.3f} GB: {copy_s:.2f} s, "
                  f"{copy_gbps:.2f} GB/s")
        med = {k: statistics.median(r[k] for r in runs)
               for k in ("convert_gbps", "copy_gbps", "ratio", "dequantize_share")}
        print(f"convert on {args.device} ({args.dtype}, {args.layout} layout): "
              f"{med['convert_gbps']:.2f} GB/s written, "
              f"{100 * med['dequantize_share']:.1f}% of the time in dequantize; plain copy "
              f"{med['copy_gbps']:.2f} GB/s; ratio to the plain copy {med['ratio']:.2f}"
              f"{' (median of %d runs)' % len(runs) if len(runs) > 1 else ''}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"args": vars(args), "source_bytes": src_bytes, "runs": runs,
                           "median": med}, f, indent=2)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
