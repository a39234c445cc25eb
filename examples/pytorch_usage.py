"""awq_fast_dequant from PyTorch: quantize a model, run it, save it as a Hugging Face AWQ
checkpoint and load it back.

A small Llama with random weights (built from a transformers LlamaConfig, nothing is
downloaded) is quantized in place with quantize_model: every nn.Linear that fits the
AWQ format becomes an AWQLinear, lm_head stays dense; fuse_projections then has the
layers that take one input (q/k/v, gate/up) computed by one call each. The model's own
save_pretrained writes an AWQ checkpoint folder; load_pretrained reads it into a new
model (and fuses the same layers), which must give the same logits and the same greedy
continuation. Runs on the CPU as written
(float32); pass --device cuda for the GPU (float16).

    pip install "awq_fast_dequant[hf]"
    python examples/pytorch_usage.py [--device cuda]
"""

import argparse
import tempfile

import torch
import transformers

from awq_fast_dequant.torch import AWQLinear, fuse_projections, load_pretrained, quantize_model


def main():
    ap = argparse.ArgumentParser(description="quantize_model, save_pretrained, load_pretrained")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    device = torch.device(ap.parse_args().device)
    dtype = torch.float32 if device.type == "cpu" else torch.float16

    config = transformers.LlamaConfig(
        vocab_size=1024, hidden_size=256, intermediate_size=768, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, initializer_range=0.1)
    torch.manual_seed(0)
    # Built in its dtype, as from_pretrained and load_pretrained build a model: buffers
    # it computes itself (the rotary embedding's frequencies) stay float32, as they do
    # in the reloaded model. model.to(dtype) would make them float16 too.
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    model = model.to(device).eval()
    ids = torch.randint(0, config.vocab_size, (1, 16), device=device)

    # 1. Quantize in place: 4-bit weights, one scale and zero point per 128 inputs.
    skipped = quantize_model(model, group_size=128)
    layers = sum(isinstance(m, AWQLinear) for m in model.modules())
    print(f"quantized {layers} layers; left dense: {skipped}")
    print(model.model.layers[0].mlp.down_proj)

    # 2. Run it: AWQLinear.forward is the fused 4-bit linear layer. fuse_projections
    #    has q/k/v and gate/up computed by one call each (fewer, larger launches).
    print(f"fused: {fuse_projections(model)}")
    with torch.no_grad():
        logits = model(ids).logits
    print(f"logits {tuple(logits.shape)}, next token {logits[0, -1].argmax().item()}")

    # 3. save_pretrained writes a Hugging Face AWQ checkpoint; load_pretrained reads it.
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        loaded = load_pretrained(folder, device=device)
        with torch.no_grad():
            same_logits = torch.equal(loaded(ids).logits, logits)
        generate = dict(max_new_tokens=20, do_sample=False, pad_token_id=0,
                        attention_mask=torch.ones_like(ids))
        same_tokens = torch.equal(loaded.generate(ids, **generate),
                                  model.generate(ids, **generate))

    print(f"reloaded model: same logits {same_logits}, same 20 greedy tokens {same_tokens}")
    if not (same_logits and same_tokens):
        raise SystemExit("FAILED: the reloaded model differs")
    print("OK")


if __name__ == "__main__":
    main()
