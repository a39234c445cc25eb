"""Hugging Face integration: a small Llama quantized with quantize_model, written by its own
save_pretrained and read back by load_pretrained; what load_pretrained refuses and when;
the decoder-layer benchmark script on a tiny layer; the PyTorch example."""

import copy
import fnmatch
import json
import logging
import re
import shutil
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest

import awq_fast_dequant as awq

from conftest import assert_linear_close, child_env

torch = pytest.importorskip("torch", reason="needs torch")
transformers = pytest.importorskip(
    "transformers", minversion="5",
    reason="needs transformers 5 or later: pip install 'awq_fast_dequant[hf]'")
safetensors_torch = pytest.importorskip(
    "safetensors.torch", reason="needs safetensors: pip install 'awq_fast_dequant[hf]'")
nn = torch.nn

from awq_fast_dequant.torch import AWQLinear, load_pretrained, parameters_on_meta  # noqa: E402
from awq_fast_dequant.torch import fuse_projections, quantize_model  # noqa: E402
from awq_fast_dequant.torch import _hf  # noqa: E402
from awq_fast_dequant.checkpoint import format_nbytes, open_checkpoint  # noqa: E402

HAS_CUDA = awq.cuda_available() and torch.cuda.is_available()
cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
REPO = Path(__file__).resolve().parents[1]
NEW_TOKENS = 32


def small_llama(tie=False, seed=0, dtype=torch.float32):
    """A Llama with every dimension a multiple of 128 and random weights. A wide
    initializer makes the next-token distribution peaked, so greedy decoding
    does not hinge on near-ties."""
    config = transformers.LlamaConfig(
        vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        initializer_range=0.2, tie_word_embeddings=tie)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).to(dtype).eval()


def dense_twin(model):
    """The same model with every AWQLinear replaced by an nn.Linear holding its dequantized weight."""
    twin = copy.deepcopy(model)
    for name, m in list(twin.named_modules()):
        if isinstance(m, AWQLinear):
            dense = nn.Linear(m.in_features, m.out_features, bias=m.bias is not None,
                              dtype=m.scales.dtype, device=m.scales.device)
            dense.weight.data = m.dequantized_weight()
            if m.bias is not None:
                dense.bias.data = m.bias.clone()
            parent, _, child = name.rpartition(".")
            setattr(twin.get_submodule(parent), child, dense)
    return twin


def prompt(device="cpu"):
    return torch.randint(0, 512, (2, 12), generator=torch.Generator().manual_seed(5)).to(device)


def generate(model, ids, new_tokens=NEW_TOKENS, **kw):
    return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                          do_sample=False, pad_token_id=0, **kw)


def every_layer_within_linear_tolerance(model, ids):
    """Runs model on ids and checks each AWQLinear's output against the float64 reference
    of its own input: the tolerance of linear(), layer by layer. Returns the layer count."""
    seen = []

    def hook(layer, inputs, output):
        seen.append((layer, inputs[0].detach().clone(), output.detach().clone()))

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, AWQLinear)]
    try:
        with torch.no_grad():
            model(ids)
    finally:
        for h in handles:
            h.remove()
    for layer, x, y in seen:
        assert_linear_close(y, x, layer.qweight, layer.qzeros, layer.scales, layer.bias)
    return len(seen)


def dense_logits_and_bound(dense_model, ids, dtype):
    """The dense model's logits on ids in float64, and how far from them logits computed
    in dtype with linear() in place of every projection may lie: depth x (2^-9 (|h| @
    |W_lm|^T) + 1 ulp), h the dense model's last hidden state -- the tolerance of
    linear() at the layer that makes the logits, once for it and once for each
    sequential projection before it (q/k/v, o, gate/up, down per decoder layer): the
    two models round differently at every one of them, and in float16 / bfloat16 those
    differences carry to the logits."""
    with torch.no_grad():
        out = dense_model(ids, output_hidden_states=True)
    h = out.hidden_states[-1].double()
    W = dense_model.lm_head.weight.double()
    want = out.logits.double()
    depth = 1 if dtype == torch.float32 else 1 + 4 * dense_model.config.num_hidden_layers
    return want, depth * (2.0**-9 * (h.abs() @ W.abs().t()) + torch.finfo(dtype).eps * want.abs())


def logits_within_linear_tolerance(got, dense_model, ids):
    """got within dense_logits_and_bound's bound of the dense model's logits. Returns
    (max error, the largest share of its tolerance an error uses)."""
    want, bound = dense_logits_and_bound(dense_model, ids, got.dtype)
    err = (got.double() - want).abs()
    assert torch.all(err <= bound), f"max excess {(err - bound).max().item():.3e}"
    return err.max().item(), (err / bound).max().item()


def greedy_agrees_up_to_a_near_tie(got, want, model, dense_model):
    """got and want: greedy sequences from the same prompt, by model and by its dense twin.
    Each row must equal want's, or part from it only at a near-tie: at the first token
    where they differ, the dense model (on the common prefix) ranks the two tokens within
    the sum of their logits' tolerances, and model's own logits there lie within theirs.
    bfloat16 keeps 8 bits of mantissa: two models that round differently may break such
    a tie either way, and the sequences go separate ways after it. The tolerance is a
    bound, not the error seen: in bfloat16 it spans the gap between the two best tokens
    at most positions, so this only refuses a token that the dense model ranks clearly
    lower. Returns the number of rows that parted."""
    assert got.shape == want.shape
    parted = 0
    for row in range(want.shape[0]):
        differ = (got[row] != want[row]).nonzero()
        if differ.numel() == 0:
            continue
        p = differ[0].item()
        prefix = want[row:row + 1, :p]
        logits, bound = dense_logits_and_bound(dense_model, prefix, model.dtype)
        ours, theirs = got[row, p].item(), want[row, p].item()
        gap = logits[0, -1, theirs] - logits[0, -1, ours]
        assert gap <= bound[0, -1, theirs] + bound[0, -1, ours], (
            f"row {row} parts at token {p}: dense logits {gap.item():.3e} apart, "
            f"beyond the tolerance {(bound[0, -1, theirs] + bound[0, -1, ours]).item():.3e}")
        with torch.no_grad():
            logits_within_linear_tolerance(model(prefix).logits, dense_model, prefix)
        parted += 1
    return parted


@pytest.fixture(scope="module")
def saved_llama(tmp_path_factory):
    """(folder, the quantized model in memory) for G = 128."""
    model = small_llama()
    skipped = quantize_model(model, 128)
    assert skipped == [("lm_head", "matches skip pattern 'lm_head'")]
    folder = tmp_path_factory.mktemp("llama-awq")
    model.save_pretrained(folder)
    return folder, model


def test_save_pretrained_writes_an_awq_checkpoint(saved_llama):
    folder, model = saved_llama
    config = json.loads((folder / "config.json").read_text())
    assert config["quantization_config"] == {
        "quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
        "version": "gemm", "modules_to_not_convert": ["lm_head"]}
    tensors = safetensors_torch.load_file(str(folder / "model.safetensors"))
    q = "model.layers.1.mlp.down_proj"
    assert tensors[f"{q}.qweight"].dtype == torch.int32
    assert tensors[f"{q}.qweight"].shape == (512, 32)
    assert tensors[f"{q}.qzeros"].shape == (4, 32)
    assert tensors[f"{q}.scales"].shape == (4, 256)
    assert f"{q}.weight" not in tensors and "lm_head.weight" in tensors


def test_load_pretrained_round_trip_logits_and_generate(saved_llama, capsys):
    folder, model = saved_llama
    loaded = load_pretrained(folder)
    assert not loaded.training and isinstance(loaded, transformers.LlamaForCausalLM)
    awq_layers = {n: m for n, m in loaded.named_modules() if isinstance(m, AWQLinear)}
    assert len(awq_layers) == 14 and type(loaded.lm_head) is nn.Linear
    for name, m in awq_layers.items():
        src = model.get_submodule(name)
        for buf in ("qweight", "qzeros", "scales"):
            assert torch.equal(getattr(m, buf), getattr(src, buf)), (name, buf)
    for name, t in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], t), name
    assert not any(t.is_meta for t in loaded.state_dict().values())

    ids = prompt()
    twin = dense_twin(loaded)
    assert every_layer_within_linear_tolerance(loaded, ids) == 14
    with torch.no_grad():
        got = loaded(ids).logits
    err, share = logits_within_linear_tolerance(got, twin, ids)
    a = generate(loaded, ids)
    b = generate(twin, ids)
    with capsys.disabled():
        print(f"\nsmall Llama (float32, G=128): logits max |error| {err:.3e} against the "
              f"dense dequantized model, at most {share:.2e} of linear()'s tolerance; "
              f"greedy {NEW_TOKENS} tokens agree: {torch.equal(a, b)}")
    assert a.shape == (2, 12 + NEW_TOKENS) and torch.equal(a, b)


def test_the_near_tie_check_refuses_a_clear_disagreement(saved_llama):
    folder, _ = saved_llama
    loaded = load_pretrained(folder)
    twin = dense_twin(loaded)
    ids = prompt()
    b = generate(twin, ids, 4)
    assert greedy_agrees_up_to_a_near_tie(b.clone(), b, loaded, twin) == 0
    with torch.no_grad():
        ranked = twin(b[:1, :12]).logits[0, -1].argsort(descending=True)
    a = b.clone()
    a[0, 12] = ranked[len(ranked) // 2]  # a middling token where the twin's best stands
    with pytest.raises(AssertionError, match="row 0 parts at token 12"):
        greedy_agrees_up_to_a_near_tie(a, b, loaded, twin)


def test_load_pretrained_static_cache_generate(saved_llama):
    folder, model = saved_llama
    loaded = load_pretrained(folder)
    ids = prompt()
    a = generate(loaded, ids, 8, cache_implementation="static")
    b = generate(model, ids, 8)
    assert torch.equal(a, b)


def test_load_pretrained_dtype(saved_llama):
    folder, model = saved_llama
    # unfused where the bits of the model in memory are expected: a fused group's wider
    # layer may tune to another path, and is held to linear()'s tolerance
    loaded = load_pretrained(folder, dtype=torch.bfloat16, fuse=False)
    assert loaded.model.layers[0].mlp.up_proj.scales.dtype == torch.bfloat16
    assert loaded.model.embed_tokens.weight.dtype == torch.bfloat16
    assert loaded.model.layers[0].mlp.up_proj.qweight.dtype == torch.int32
    # the same as converting the quantized model's weights in memory; the buffers the
    # model computes itself (rotary frequencies) keep the dtype the model gives them
    converted = copy.deepcopy(model).to(torch.bfloat16)
    for name, buf in model.named_buffers():
        if name not in model.state_dict():
            parent, _, attr = name.rpartition(".")
            setattr(converted.get_submodule(parent), attr, buf.clone())
    for name, t in converted.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], t), name
    ids = prompt()
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, converted(ids).logits)


class LlamaWithAComputedScale(transformers.LlamaForCausalLM):
    """A model that computes a floating-point buffer in the default dtype, as Gemma's
    scaled embeddings do."""

    def __init__(self, config):
        super().__init__(config)
        self.register_buffer("third", torch.tensor(1 / 3), persistent=False)


class LlamaWithFloat32Parts(transformers.LlamaForCausalLM):
    """As DeepSeek-V3's router: a checkpoint buffer the model builds in float32, and a
    module transformers keeps in float32 under float16 and bfloat16."""

    _keep_in_fp32_modules_strict = ["model.norm"]

    def __init__(self, config):
        super().__init__(config)
        self.register_buffer("correction", torch.arange(8, dtype=torch.float32) / 3)


def test_tensors_transformers_keeps_in_float32_stay_float32(tmp_path):
    torch.manual_seed(0)
    model = LlamaWithFloat32Parts(small_llama().config).eval()
    with torch.no_grad():
        model.model.norm.weight.uniform_(0.5, 1.5)
    model.save_pretrained(tmp_path / "dense")
    quantize_model(model, 128)
    model.save_pretrained(tmp_path / "awq")
    for dtype in (torch.float16, torch.bfloat16):
        dense = LlamaWithFloat32Parts.from_pretrained(tmp_path / "dense", dtype=dtype)
        loaded = load_pretrained(tmp_path / "awq", dtype=dtype, model_class=LlamaWithFloat32Parts,
                                 fuse=False)
        for name in ("correction", "model.norm.weight"):
            got = loaded.state_dict()[name]
            assert got.dtype == dense.state_dict()[name].dtype == torch.float32, name
            assert torch.equal(got, model.state_dict()[name]), name
        assert loaded.model.embed_tokens.weight.dtype == dtype
        assert loaded.model.layers[0].mlp.up_proj.scales.dtype == dtype


def test_load_pretrained_builds_the_model_in_dtype(saved_llama):
    """The buffers a model computes itself are made as transformers makes them for that
    dtype, not in the dtype config.json was saved in."""
    folder = saved_llama[0]
    config = transformers.AutoConfig.from_pretrained(folder)
    del config.quantization_config
    for dtype in (torch.bfloat16, torch.float16):
        loaded = load_pretrained(folder, dtype=dtype, model_class=LlamaWithAComputedScale)
        built = LlamaWithAComputedScale._from_config(copy.deepcopy(config), dtype=dtype)
        assert loaded.third.dtype == built.third.dtype == dtype
        assert torch.equal(loaded.third, built.third)
        assert loaded.config.dtype == dtype


def test_a_quant_config_json_checkpoint_saves_back_as_one_load_pretrained_reads(saved_llama,
                                                                                tmp_path):
    """A checkpoint whose quantization settings are only in AutoAWQ's quant_config.json
    loads, and the model's own save_pretrained writes them into config.json."""
    folder, model = saved_llama
    autoawq = shutil.copytree(folder, tmp_path / "autoawq")
    config = json.loads((autoawq / "config.json").read_text())
    del config["quantization_config"]
    (autoawq / "config.json").write_text(json.dumps(config))
    (autoawq / "quant_config.json").write_text(json.dumps(
        {"zero_point": True, "q_group_size": 128, "w_bit": 4, "version": "GEMM"}))
    loaded = load_pretrained(autoawq)
    assert loaded.config.quantization_config["group_size"] == 128
    loaded.save_pretrained(tmp_path / "again")
    saved = json.loads((tmp_path / "again" / "config.json").read_text())
    assert saved["quantization_config"]["quant_method"] == "awq"
    again = load_pretrained(tmp_path / "again", fuse=False)
    ids = prompt()
    with torch.no_grad():
        assert torch.equal(again(ids).logits, model(ids).logits)


def test_load_pretrained_progress_lines_without_tqdm(saved_llama, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm raises ImportError
    folder = saved_llama[0]
    info = open_checkpoint(folder).tensors
    total = sum(t.nbytes for t in info.values())  # every tensor has a place in the model
    load_pretrained(folder, progress=True)
    lines = capsys.readouterr().err.splitlines()
    steps = [re.fullmatch(r"load_pretrained (\d+)% \(([\d.]+ [kMG]?B) of ([\d.]+ [kMG]?B), "
                          r"(\d+)/(\d+) tensors\)", line) for line in lines]
    assert all(steps) and 2 <= len(steps) <= 10, lines  # a line a tenth crossed, at most
    tenths = [int(m.group(1)) // 10 for m in steps]
    counts = [int(m.group(4)) for m in steps]
    assert tenths == sorted(set(tenths)) and steps[-1].group(1) == "100"
    assert counts == sorted(set(counts)) and counts[-1] == int(steps[0].group(5)) == len(info)
    assert {m.group(3) for m in steps} == {format_nbytes(total)}
    assert steps[-1].group(2) == format_nbytes(total)


def test_load_pretrained_progress_bar_and_silence(saved_llama, capsys):
    pytest.importorskip("tqdm", reason="needs tqdm")
    load_pretrained(saved_llama[0], progress=True)
    err = capsys.readouterr().err
    assert "load_pretrained" in err and "100%" in err
    load_pretrained(saved_llama[0])
    assert capsys.readouterr().err == ""


# --- mixture-of-experts models and checkpoint names transformers converts ----------

def small_moe(kind, seed=0):
    """A mixture-of-experts model of transformers 5's kind, whose experts live in 3-D
    tensors: Mixtral (its checkpoints name them block_sparse_moe.experts.<e>.w1/w3/w2)
    or Qwen2-MoE (mlp.experts.<e>.gate_proj/up_proj/down_proj, beside a shared expert)."""
    common = dict(vocab_size=512, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2,
                  num_experts_per_tok=2)
    if kind == "mixtral":
        config = transformers.MixtralConfig(intermediate_size=512, num_local_experts=4, **common)
    else:
        config = transformers.Qwen2MoeConfig(intermediate_size=512, moe_intermediate_size=256,
                                             shared_expert_intermediate_size=256, num_experts=4,
                                             **common)
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


EXPERT_NAMES = {"mixtral": ("w1", "w3", "w2"), "qwen2_moe": ("gate_proj", "up_proj", "down_proj")}


@pytest.mark.parametrize("kind", sorted(EXPERT_NAMES))
def test_unfused_experts_compute_what_the_fused_module_does(kind):
    from awq_fast_dequant.torch import UnfusedExperts, _experts

    model = small_moe(kind)
    fused = _experts.find_fused(model)
    assert sorted(fused) == [f"model.layers.{i}.mlp.experts" for i in range(2)]
    assert _experts.expert_names(model) == EXPERT_NAMES[kind]
    ids = prompt()
    with torch.no_grad():
        want = model(ids).logits
        for path, (module, shapes) in fused.items():
            unfused = _experts.unfuse(module, EXPERT_NAMES[kind])
            assert isinstance(unfused, UnfusedExperts) and unfused.num_experts == shapes[0] == 4
            parent, _, child = path.rpartition(".")
            setattr(model.get_submodule(parent), child, unfused)
        got = model(ids).logits
    # the same sums, each expert's gate and up apart where transformers multiplies them
    # together (or all experts in one grouped matmul): BLAS may order them otherwise
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_unfused_experts_route_each_token_to_its_experts():
    from awq_fast_dequant.torch import UnfusedExperts

    torch.manual_seed(0)
    names = ("g", "u", "d")

    def expert():
        m = nn.Module()
        m.g, m.u, m.d = nn.Linear(8, 16, bias=False), nn.Linear(8, 16, bias=False), \
            nn.Linear(16, 8, bias=False)
        return m

    experts = UnfusedExperts([expert() for _ in range(3)], names, nn.GELU())
    x = torch.randn(4, 8)
    index = torch.tensor([[0, 2], [1, 3], [2, 0], [3, 3]])  # 3: a sentinel, routed nowhere
    weights = torch.rand(4, 2)
    want = torch.zeros(4, 8)
    for t in range(4):
        for j in range(2):
            e = int(index[t, j])
            if e < 3:
                m = experts.expert(e)
                want[t] += m.d(nn.functional.gelu(m.g(x[t])) * m.u(x[t])) * weights[t, j]
    with torch.no_grad():
        got = experts(x, index, weights)
    torch.testing.assert_close(got, want)
    assert torch.equal(got[3], torch.zeros(8))
    with pytest.raises(ValueError, match="three different names"):
        UnfusedExperts([], ("a", "a", "b"))


@pytest.mark.parametrize("kind", sorted(EXPERT_NAMES))
def test_every_experts_gate_and_up_fuse_whether_routed_to_or_not(kind):
    model = small_moe(kind)
    quantize_model(model, 128)
    reference = copy.deepcopy(model)
    gate, up, _ = EXPERT_NAMES[kind]
    one_token = prompt()[:1, :1]  # routed to two experts of four in each layer
    groups = fuse_projections(model, {"input_ids": one_token})
    experts = {g for g in groups if ".experts." in g[0]}
    assert len(experts) == 2 * 4
    assert all(g[0].endswith(f".{gate}") and g[1].endswith(f".{up}") for g in experts)
    ids = prompt()
    with torch.no_grad():
        got, want = model(ids).logits, reference(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", sorted(EXPERT_NAMES))
def test_mixture_of_experts_quantized_saved_and_loaded(kind, tmp_path):
    from awq_fast_dequant.torch import UnfusedExperts

    model = small_moe(kind)
    ids = prompt()
    skipped = quantize_model(model, 128, calibration=[ids[:1], ids[1:]])
    if kind == "mixtral":
        assert skipped == [("lm_head", "matches skip pattern 'lm_head'")]
    else:  # the shared expert's gate has one output
        assert [name for name, _ in skipped] == [
            "model.layers.0.mlp.shared_expert_gate", "model.layers.1.mlp.shared_expert_gate",
            "lm_head"]
    gate, up, down = EXPERT_NAMES[kind]
    for layer in model.model.layers:
        experts = layer.mlp.experts
        assert isinstance(experts, UnfusedExperts) and experts.num_experts == 4
        for e in range(4):
            for name in (gate, up, down):
                assert isinstance(getattr(experts.expert(e), name), AWQLinear)
    assert every_layer_within_linear_tolerance(model, ids) > 0
    model.save_pretrained(tmp_path)
    names = set(open_checkpoint(tmp_path).tensors)
    # the checkpoint's own names: AutoAWQ's layout, as transformers writes it back
    moe = "block_sparse_moe" if kind == "mixtral" else "mlp"
    assert f"model.layers.1.{moe}.experts.3.{down}.qweight" in names
    assert not any("gate_up_proj" in n for n in names)

    loaded = load_pretrained(tmp_path)
    assert isinstance(loaded.model.layers[0].mlp.experts, UnfusedExperts)
    assert sum(isinstance(m, AWQLinear) for m in loaded.modules()) == \
        sum(isinstance(m, AWQLinear) for m in model.modules())
    # load_pretrained fused each expert's gate and up projections (and q/k/v): so
    # does the model it is compared with
    assert fuse_projections(model)
    with torch.no_grad():
        got, want = loaded(ids).logits, model(ids).logits
    assert torch.equal(got, want)
    logits_within_linear_tolerance(got, dense_twin(model), ids)
    assert torch.equal(generate(loaded, ids, 8), generate(model, ids, 8))


def test_experts_left_fused_by_skip_or_layout_are_reported(tmp_path):
    model = small_moe("mixtral")
    ids = prompt()
    fused = model.model.layers[0].mlp.experts
    skipped = quantize_model(model, 128, skip=("lm_head", "experts"))
    assert model.model.layers[0].mlp.experts is fused
    assert ("model.layers.0.mlp.experts", "matches skip pattern 'experts'") in skipped
    # written as per-expert dense tensors, read back into per-expert nn.Linear layers
    model.save_pretrained(tmp_path)
    loaded = load_pretrained(tmp_path, fuse=False)
    with torch.no_grad():  # per expert, as test_unfused_experts_compute_what_the_fused_module_does
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)

    class Transposed(nn.Module):  # gate_up_proj [E, H, 2I], down_proj [E, I, H]
        def __init__(self):
            super().__init__()
            self.gate_up_proj = nn.Parameter(torch.randn(2, 128, 512))
            self.down_proj = nn.Parameter(torch.randn(2, 256, 128))
            self.act_fn = nn.SiLU()

    other = nn.Module()
    other.experts, other.proj = Transposed(), nn.Linear(128, 64)
    skipped = quantize_model(other, 128)
    assert type(other.experts) is Transposed and isinstance(other.proj, AWQLinear)
    assert skipped[0][0] == "experts" and "layout other than transformers' standard" in \
        skipped[0][1]


def test_quantize_model_failing_puts_the_fused_experts_back():
    model = small_moe("mixtral")
    fused = [layer.mlp.experts for layer in model.model.layers]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    bad = model.model.embed_tokens.weight
    with torch.no_grad():
        bad[7] = float("inf")  # the calibration's first token: inf inputs
    before["model.embed_tokens.weight"] = bad.detach().clone()
    with pytest.raises(ValueError, match="cannot be quantized: hessian must be finite"):
        quantize_model(model, 128, calibration=[torch.tensor([[7, 8, 9]])])
    assert [layer.mlp.experts for layer in model.model.layers] == fused
    state = model.state_dict()
    assert state.keys() == before.keys()
    assert all(torch.equal(state[k], v) for k, v in before.items())


def test_gpt_neox_checkpoint_names_are_transformers_own(tmp_path, monkeypatch):
    config = transformers.GPTNeoXConfig(vocab_size=512, hidden_size=256, intermediate_size=512,
                                        num_hidden_layers=2, num_attention_heads=4)
    torch.manual_seed(0)
    model = transformers.GPTNeoXForCausalLM(config).eval()
    quantize_model(model, 128)
    model.save_pretrained(tmp_path)
    names = set(open_checkpoint(tmp_path).tensors)
    head = "embed_out.weight" if "embed_out.weight" in names else "lm_head.weight"
    loaded = load_pretrained(tmp_path, fuse=False)
    ids = prompt()
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
    assert torch.equal(loaded.get_output_embeddings().weight,
                       safetensors_torch.load_file(tmp_path / "model.safetensors")[head])
    if head != "embed_out.weight":
        return  # this transformers names it lm_head in checkpoints too
    # a checkpoint holding both names: two tensors for one place, refused before reading
    both = edited_copy(tmp_path, tmp_path.parent / "both",
                       change={"lm_head.weight": torch.zeros(512, 256)})

    def refuse(*a, **k):
        raise AssertionError("load_pretrained read a tensor of a bad checkpoint")

    monkeypatch.setattr(_hf, "_load", refuse)
    with pytest.raises(ValueError, match="holds 'embed_out.weight' and 'lm_head.weight', "
                                         "which transformers' names for GPTNeoXForCausalLM "
                                         "both make 'lm_head.weight'"):
        load_pretrained(both)


def test_falcon_linear_layers_are_quantized(tmp_path):
    config = transformers.FalconConfig(vocab_size=512, hidden_size=256, num_hidden_layers=2,
                                       num_attention_heads=4)
    torch.manual_seed(0)
    model = transformers.FalconForCausalLM(config).eval()
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    assert all(type(m).__name__ == "FalconLinear" for n, m in model.named_modules()
               if isinstance(m, nn.Linear) and n != "lm_head")
    assert quantize_model(model, 128) == [("lm_head", "matches skip pattern 'lm_head'")]
    assert sum(isinstance(m, AWQLinear) for m in model.modules()) == len(linears) - 1 == 8
    model.save_pretrained(tmp_path)
    loaded = load_pretrained(tmp_path, fuse=False)
    ids = prompt()
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
    assert every_layer_within_linear_tolerance(loaded, ids) == 8


def test_tied_embeddings_stay_tied(tmp_path):
    model = small_llama(tie=True)
    assert dict(quantize_model(model, 128, skip=None)) == {
        "lm_head": "its weight is tied to model.embed_tokens.weight; quantizing it would "
                   "untie them"}
    model.save_pretrained(tmp_path)
    loaded = load_pretrained(tmp_path, fuse=False)
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    ids = prompt()
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_tied_config_with_a_different_lm_head_in_the_checkpoint_unties_them(saved_llama, tmp_path,
                                                                           caplog):
    """config.json ties lm_head to the embeddings, but the checkpoint holds an lm_head.weight
    of its own: each is read from its own tensor, with a warning naming both. An
    lm_head.weight equal to the embeddings stays tied."""
    folder, model = saved_llama
    untied = edited_copy(folder, tmp_path / "untied")
    data = json.loads((untied / "config.json").read_text())
    data["tie_word_embeddings"] = True
    (untied / "config.json").write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING, logger="awq_fast_dequant"):
        loaded = load_pretrained(untied, fuse=False)
    assert loaded.lm_head.weight is not loaded.model.embed_tokens.weight
    assert torch.equal(loaded.lm_head.weight, model.lm_head.weight)
    assert torch.equal(loaded.model.embed_tokens.weight, model.model.embed_tokens.weight)
    assert "lm_head.weight" not in loaded.all_tied_weights_keys  # init_weights() keeps them apart
    assert ("LlamaForCausalLM ties model.embed_tokens.weight and lm_head.weight, but the "
            "checkpoint holds them with different values; each is read from its own tensor, "
            "untied") in caplog.text
    assert "no place" not in caplog.text  # lm_head.weight is read
    ids = prompt()
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)

    caplog.clear()
    same = edited_copy(untied, tmp_path / "same",
                       change={"lm_head.weight": model.model.embed_tokens.weight.detach().clone()})
    with caplog.at_level(logging.WARNING, logger="awq_fast_dequant"):
        tied = load_pretrained(same)
    assert tied.lm_head.weight is tied.model.embed_tokens.weight
    assert torch.equal(tied.lm_head.weight, model.model.embed_tokens.weight)
    assert caplog.text == ""


def test_sharded_checkpoint_with_index(tmp_path):
    model = small_llama(seed=1)
    quantize_model(model, 64)
    model.save_pretrained(tmp_path, max_shard_size="300KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 2
    loaded = load_pretrained(tmp_path, fuse=False)
    assert loaded.model.layers[0].self_attn.q_proj.group_size == 64
    ids = prompt()
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_base_model_checkpoint_into_a_model_with_a_head(tmp_path):
    """Tensors saved by LlamaModel (no 'model.' prefix) load into LlamaForCausalLM, whose
    lm_head is tied to the embeddings."""
    model = small_llama(tie=True)
    quantize_model(model, 128)
    model.model.save_pretrained(tmp_path)
    body_only = load_pretrained(tmp_path, fuse=False)
    assert isinstance(body_only, transformers.LlamaModel)
    with_head = load_pretrained(tmp_path, model_class=transformers.LlamaForCausalLM, fuse=False)
    assert with_head.lm_head.weight is with_head.model.embed_tokens.weight
    ids = prompt()
    with torch.no_grad():
        assert torch.equal(body_only(ids).last_hidden_state, model.model(ids).last_hidden_state)
        assert torch.equal(with_head(ids).logits, model(ids).logits)


def test_model_class_argument(saved_llama):
    folder, model = saved_llama
    auto = load_pretrained(folder, model_class=transformers.AutoModelForCausalLM)
    assert isinstance(auto, transformers.LlamaForCausalLM)
    # the body of a model with a head: names lose the 'model.' prefix, lm_head is not read
    body = load_pretrained(folder, model_class=transformers.LlamaModel, fuse=False)
    ids = prompt()
    with torch.no_grad():
        assert torch.equal(body(ids).last_hidden_state, model.model(ids).last_hidden_state)


def test_a_quantized_lm_head_is_left_out_of_the_base_model(tmp_path, caplog):
    """The body of a checkpoint whose lm_head is quantized loads into LlamaModel, the head's
    tensors reported as unread like dense ones; a quantized layer of the body that the model
    lacks is still an error (config.json is not the checkpoint's)."""
    model = small_llama()
    assert quantize_model(model, 128, skip=None) == []
    folder = tmp_path / "ckpt"
    model.save_pretrained(folder)
    assert isinstance(load_pretrained(folder).lm_head, AWQLinear)
    ids = prompt()
    for cls in (transformers.LlamaModel, transformers.AutoModel):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="awq_fast_dequant"):
            body = load_pretrained(folder, model_class=cls, fuse=False)
        assert type(body) is transformers.LlamaModel
        assert ("3 checkpoint tensors have no place in LlamaModel and are not read: "
                "lm_head.qweight, lm_head.qzeros, lm_head.scales") in caplog.text
        with torch.no_grad():
            assert torch.equal(body(ids).last_hidden_state, model.model(ids).last_hidden_state)
    data = json.loads((folder / "config.json").read_text())
    data["num_hidden_layers"] = 1
    (folder / "config.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"quantizes layer 'model.layers.1.mlp.down_proj', "
                                         r"which LlamaModel does not have"):
        load_pretrained(folder, model_class=transformers.LlamaModel)


def small_gpt_bigcode():
    """A GPT-BigCode, one of the models whose AutoAWQ checkpoints scale the MLP's activation."""
    config = transformers.GPTBigCodeConfig(
        vocab_size=512, n_positions=64, n_embd=128, n_layer=2, n_head=2, n_inner=512,
        initializer_range=0.2)
    torch.manual_seed(3)
    return transformers.GPTBigCodeForCausalLM(config).eval()


@pytest.fixture(scope="module")
def scaled_gpt_bigcode(tmp_path_factory):
    """(folder without activation scales, folder with them, the scales)."""
    model = small_gpt_bigcode()
    quantize_model(model, 128)
    plain = tmp_path_factory.mktemp("bigcode-awq")
    model.save_pretrained(plain)
    g = torch.Generator().manual_seed(4)
    scales = {f"transformer.h.{i}.mlp.act.scales": torch.rand(512, generator=g) + 0.5
              for i in range(2)}
    scaled = edited_copy(plain, tmp_path_factory.mktemp("bigcode-awq-scaled") / "c",
                         change=scales)
    return plain, scaled, scales


def test_autoawq_activation_scales_are_divided_out(scaled_gpt_bigcode, tmp_path, caplog):
    plain, scaled, scales = scaled_gpt_bigcode
    with caplog.at_level(logging.WARNING, logger="awq_fast_dequant"):
        loaded = load_pretrained(scaled)
    assert "not read" not in caplog.text
    for i, block in enumerate(loaded.transformer.h):
        assert isinstance(block.mlp.act, _hf.ScaledActivation)
        assert torch.equal(block.mlp.act.scales, scales[f"transformer.h.{i}.mlp.act.scales"])
    # The same checkpoint without the scales, each activation's output divided by them in a hook.
    hooked = load_pretrained(plain)
    for i, block in enumerate(hooked.transformer.h):
        s = scales[f"transformer.h.{i}.mlp.act.scales"]
        block.mlp.act.register_forward_hook(lambda module, args, out, s=s: out / s)
    ids = prompt()
    with torch.no_grad():
        got = loaded(ids).logits
        assert torch.equal(got, hooked(ids).logits)
        assert not torch.allclose(got, load_pretrained(plain)(ids).logits, atol=1e-3)
    # The model's own save_pretrained writes the scales back where they were read from.
    loaded.save_pretrained(tmp_path / "again")
    with torch.no_grad():
        assert torch.equal(load_pretrained(tmp_path / "again")(ids).logits, got)


@pytest.mark.parametrize("name, value, message", [
    ("transformer.h.0.mlp.gelu.scales", torch.ones(512),
     r"holds 'transformer.h.0.mlp.gelu.scales', the scales of a scaled activation .* "
     r"GPTBigCodeForCausalLM has no module 'transformer.h.0.mlp.gelu'"),
    ("transformer.h.0.ln_1.scales", torch.ones(128),
     r"transformer.h.0.ln_1 is a LayerNorm with tensors of its own, not an activation"),
    ("transformer.h.0.mlp.act.scales", torch.ones(2, 256),
     r"transformer.h.0.mlp.act.scales has shape \[2, 256\]; the scales of an activation"),
])
def test_activation_scales_with_no_activation_are_refused_before_reading(
        scaled_gpt_bigcode, tmp_path, monkeypatch, name, value, message):
    plain, _, _ = scaled_gpt_bigcode
    folder = edited_copy(plain, tmp_path / "c", change={name: value})
    monkeypatch.setattr(_hf, "_load", lambda *a, **k: pytest.fail("read a tensor"))
    with pytest.raises(ValueError, match=message):
        load_pretrained(folder)


# --- what load_pretrained refuses, and before what --------------------------

def edited_copy(src, dst, config=None, drop=(), change=None):
    """A copy of checkpoint `src` with its quantization_config updated by `config`,
    tensors `drop` left out and `change` (name -> tensor) replaced."""
    shutil.copytree(src, dst)
    if config:
        data = json.loads((dst / "config.json").read_text())
        data["quantization_config"].update(config)
        (dst / "config.json").write_text(json.dumps(data))
    if drop or change:
        tensors = safetensors_torch.load_file(str(dst / "model.safetensors"))
        tensors = {k: v for k, v in tensors.items() if k not in drop}
        tensors.update(change or {})
        safetensors_torch.save_file(tensors, str(dst / "model.safetensors"),
                                    metadata={"format": "pt"})
    return dst


@pytest.fixture
def nothing_built(monkeypatch):
    """Fails the test if load_pretrained builds a model or reads a tensor."""
    def refuse(*a, **k):
        raise AssertionError("load_pretrained went on after a bad checkpoint")
    monkeypatch.setattr(_hf, "_build", refuse)
    monkeypatch.setattr(_hf, "_load", refuse)


@pytest.mark.parametrize("config, message", [
    ({"version": "gemv"}, "version 'gemv' is not supported"),
    ({"version": "marlin"}, "version 'marlin' is not supported"),
    ({"version": "exllama"}, "version 'exllama' is not supported"),
    ({"version": None, "format": "gemv"}, "version 'gemv' is not supported"),
    ({"backend": "llm-awq"}, "version 'llm-awq' is not supported"),
    ({"bits": 8}, "bits is 8; only 4-bit"),
    ({"zero_point": False}, "zero_point is False"),
    ({"quant_method": "gptq"}, "quant_method is 'gptq'"),
    ({"group_size": 64}, r"qzeros has shape \[4, 32\]; expected .* group_size 64"),
])
def test_unsupported_checkpoints_are_refused_before_building(saved_llama, tmp_path, config,
                                                             message, nothing_built):
    folder = edited_copy(saved_llama[0], tmp_path / "ckpt", config=config)
    with pytest.raises(ValueError, match=message):
        load_pretrained(folder)


def test_missing_layer_tensor_is_refused_before_building(saved_llama, tmp_path, nothing_built):
    name = "model.layers.0.self_attn.k_proj.qzeros"
    folder = edited_copy(saved_llama[0], tmp_path / "ckpt", drop=[name])
    with pytest.raises(ValueError, match="k_proj' has a qweight but no qzeros"):
        load_pretrained(folder)


def test_missing_dense_tensor_is_refused_before_reading(saved_llama, tmp_path, monkeypatch):
    monkeypatch.setattr(_hf, "_load", lambda *a: pytest.fail("read tensors"))
    folder = edited_copy(saved_llama[0], tmp_path / "ckpt", drop=["model.norm.weight"])
    with pytest.raises(ValueError, match="no tensor for model.norm.weight"):
        load_pretrained(folder)


def test_model_config_that_disagrees_is_refused_before_reading(saved_llama, tmp_path,
                                                               monkeypatch):
    monkeypatch.setattr(_hf, "_load", lambda *a: pytest.fail("read tensors"))
    folder = edited_copy(saved_llama[0], tmp_path / "ckpt")
    data = json.loads((folder / "config.json").read_text())
    data["intermediate_size"] = 640
    (folder / "config.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"down_proj': the checkpoint's qweight is \[K=512, N/8=32\] "
                                         r"but the model's nn.Linear has in_features=640"):
        load_pretrained(folder)


def test_dense_tensor_of_the_wrong_shape_is_refused(saved_llama, tmp_path, monkeypatch):
    monkeypatch.setattr(_hf, "_load", lambda *a: pytest.fail("read tensors"))
    folder = edited_copy(saved_llama[0], tmp_path / "ckpt",
                         change={"model.norm.weight": torch.ones(128)})
    with pytest.raises(ValueError, match=r"model.norm.weight: checkpoint \[128\], model \[256\]"):
        load_pretrained(folder)


@pytest.mark.parametrize("dtype, code", [(torch.int32, "I32"), (torch.bool, "BOOL")], ids=str)
def test_dense_tensor_of_another_dtype_kind_is_refused_before_reading(saved_llama, tmp_path,
                                                                      monkeypatch, dtype, code):
    monkeypatch.setattr(_hf, "_load", lambda *a: pytest.fail("read tensors"))
    folder = edited_copy(saved_llama[0], tmp_path / "ckpt",
                         change={"model.norm.weight": torch.ones(256, dtype=dtype)})
    with pytest.raises(ValueError, match=rf"model.norm.weight is {code}, but LlamaForCausalLM's "
                                         r"model.norm.weight is a floating-point parameter "
                                         r"\(torch.float32\), which needs a floating-point tensor"):
        load_pretrained(folder)


class LlamaWithAStepCount(transformers.LlamaForCausalLM):
    """A model with an integer buffer that its checkpoints hold."""

    def __init__(self, config):
        super().__init__(config)
        self.register_buffer("steps", torch.zeros(2, dtype=torch.int64))


def test_float_tensor_for_an_integer_buffer_is_refused_before_reading(saved_llama, tmp_path,
                                                                      monkeypatch):
    counted = edited_copy(saved_llama[0], tmp_path / "ints",
                          change={"steps": torch.tensor([3, 4])})
    assert load_pretrained(counted, model_class=LlamaWithAStepCount).steps.tolist() == [3, 4]
    monkeypatch.setattr(_hf, "_load", lambda *a: pytest.fail("read tensors"))
    folder = edited_copy(saved_llama[0], tmp_path / "floats", change={"steps": torch.zeros(2)})
    with pytest.raises(ValueError, match=r"steps is F32, but LlamaWithAStepCount's steps is an "
                                         r"integer buffer \(torch.int64\), which needs an "
                                         r"integer tensor"):
        load_pretrained(folder, model_class=LlamaWithAStepCount)


def test_malformed_generation_config_is_refused_before_reading(saved_llama, tmp_path,
                                                               monkeypatch):
    folder = edited_copy(saved_llama[0], tmp_path / "ckpt")
    (folder / "generation_config.json").write_text('{"max_new_tokens": 7}')
    assert load_pretrained(folder).generation_config.max_new_tokens == 7
    monkeypatch.setattr(_hf, "_load", lambda *a: pytest.fail("read tensors"))
    for text in ("{", "[1, 2]"):
        (folder / "generation_config.json").write_text(text)
        with pytest.raises(ValueError, match=r"generation_config.json: transformers cannot read "
                                             r"it as a generation config"):
            load_pretrained(folder)


def test_bad_arguments(saved_llama):
    folder = saved_llama[0]
    with pytest.raises(TypeError, match="dtype must be"):
        load_pretrained(folder, dtype=torch.float64)
    with pytest.raises(ValueError, match="device must"):
        load_pretrained(folder, device="tpu")
    with pytest.raises(ValueError, match="no such file or folder"):
        load_pretrained(folder / "nowhere")


# --- a checkpoint on the Hugging Face Hub (the download faked: no network) -----------------

class FakeHub(list):
    """The calls to the fake snapshot_download, as (repo_id, revision, patterns); .repos maps
    a repository id to the folder it serves."""


@pytest.fixture
def fake_hub(saved_llama, tmp_path, monkeypatch):
    """huggingface_hub.snapshot_download serving repositories from local folders: each call
    copies the files of allow_patterns into the repository's snapshot folder, as the Hub's
    cache would hold them, and is recorded as (repo_id, revision, patterns)."""
    huggingface_hub = pytest.importorskip("huggingface_hub")
    calls = FakeHub()
    calls.repos = repos = {
        "owner/tiny-llama-awq": saved_llama[0],
        "owner/three-bits": edited_copy(saved_llama[0], tmp_path / "bits", {"bits": 3})}

    def snapshot_download(repo_id, *, revision=None, allow_patterns=None, **kw):
        calls.append((repo_id, revision, tuple(allow_patterns)))
        if repo_id not in repos:
            raise OSError(f"404 Client Error: Repository Not Found for url: "
                          f"https://huggingface.co/api/models/{repo_id}")
        snapshot = tmp_path / "hub" / repo_id.replace("/", "--") / (revision or "main")
        snapshot.mkdir(parents=True, exist_ok=True)
        for f in Path(repos[repo_id]).iterdir():
            if any(fnmatch.fnmatch(f.name, p) for p in allow_patterns):
                shutil.copyfile(f, snapshot / f.name)
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    return calls


def test_a_hub_repository_id_is_downloaded_and_loaded(saved_llama, fake_hub):
    folder, model = saved_llama
    loaded = load_pretrained("owner/tiny-llama-awq", revision="v1")
    (repo, revision, configs), (_, _, everything) = fake_hub
    assert repo == "owner/tiny-llama-awq" and revision == "v1"
    assert "config.json" in configs and not any(p.endswith(".safetensors") for p in configs)
    assert [p for p in everything if p.endswith(".safetensors")] == ["model.safetensors"]
    for name, t in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], t), name


def test_a_hub_download_fetches_only_the_checkpoints_own_weight_files(saved_llama, fake_hub,
                                                                       tmp_path):
    """Other .safetensors files of the repository (an adapter, another format's weights)
    are not downloaded: the single file, else the shards the index lists."""
    single = shutil.copytree(saved_llama[0], tmp_path / "single")
    shutil.copyfile(single / "model.safetensors", single / "adapter_model.safetensors")
    sharded = tmp_path / "sharded"
    model = small_llama(seed=1)
    quantize_model(model, 128)
    model.save_pretrained(sharded, max_shard_size="300KB")
    shards = sorted(p.name for p in sharded.glob("model-*.safetensors"))
    shutil.copyfile(single / "model.safetensors", sharded / "model.safetensors")
    fake_hub.repos.update({"owner/single": single, "owner/sharded": sharded})
    load_pretrained("owner/single")
    load_pretrained("owner/sharded")
    snapshots = tmp_path / "hub"
    assert sorted(p.name for p in (snapshots / "owner--single" / "main").glob("*.safetensors")) \
        == ["model.safetensors"]
    assert sorted(p.name for p in (snapshots / "owner--sharded" / "main").glob(
        "*.safetensors")) == shards


def test_a_hub_checkpoint_that_cannot_run_is_refused_before_its_weights_download(fake_hub):
    with pytest.raises(ValueError, match="bits is 3"):
        load_pretrained("owner/three-bits")
    assert len(fake_hub) == 1 and not any(p.endswith(".safetensors") for p in fake_hub[0][2])


def test_a_repository_the_hub_does_not_give_is_a_clear_error(fake_hub):
    with pytest.raises(ValueError, match=r"owner/nowhere: no such file or folder, and no "
                       r"checkpoint of that name could be downloaded.*Repository Not Found"):
        load_pretrained("owner/nowhere")
    assert [c[0] for c in fake_hub] == ["owner/nowhere"]


def test_a_local_folder_is_never_looked_up_on_the_hub(saved_llama, fake_hub, tmp_path,
                                                        monkeypatch):
    shutil.copytree(saved_llama[0], tmp_path / "owner" / "tiny-llama-awq")
    monkeypatch.chdir(tmp_path)
    assert isinstance(load_pretrained("owner/tiny-llama-awq"), transformers.LlamaForCausalLM)
    for not_an_id in ("owner/tiny/llama", "./owner/nowhere", str(tmp_path / "nowhere")):
        with pytest.raises(ValueError, match="no such file or folder"):
            load_pretrained(not_an_id)
    with pytest.raises(ValueError, match="revision is for a Hugging Face Hub repository id"):
        load_pretrained("owner/tiny-llama-awq", revision="v1")
    assert fake_hub == []


def test_bad_arguments_are_refused_before_a_download(fake_hub):
    with pytest.raises(ValueError, match="device must"):
        load_pretrained("owner/tiny-llama-awq", device="tpu")
    with pytest.raises(TypeError, match="dtype must be"):
        load_pretrained("owner/tiny-llama-awq", dtype=torch.float64)
    assert fake_hub == []


@pytest.mark.skipif(HAS_CUDA, reason="checks the refusal on a machine without CUDA")
def test_cuda_device_without_cuda_is_refused(saved_llama, nothing_built):
    with pytest.raises(RuntimeError, match="CUDA"):
        load_pretrained(saved_llama[0], device="cuda")


def test_without_transformers_the_error_names_the_extra(saved_llama, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError, match=r"awq_fast_dequant\[hf\]"):
        load_pretrained(saved_llama[0])


def test_transformers_4_is_refused_with_the_version_it_needs(saved_llama, monkeypatch):
    real = _hf._require
    old = types.SimpleNamespace(__version__="4.57.6")
    monkeypatch.setattr(_hf, "_require", lambda name: old if name == "transformers" else real(name))
    with pytest.raises(ImportError, match=r"needs transformers 5 or later; this is "
                                          r"transformers 4\.57\.6"):
        load_pretrained(saved_llama[0])


# torch's own, put back by parameters_on_meta on its way out
torch_register_parameter = nn.Module.register_parameter


def test_parameters_on_meta_only_in_its_thread():
    seen = {}

    def other():
        seen["other"] = nn.Linear(8, 8).weight.device.type

    with parameters_on_meta():
        layer = nn.Linear(8, 8)
        bn = nn.BatchNorm1d(8)
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    assert layer.weight.is_meta and layer.bias.is_meta and bn.weight.is_meta
    assert bn.running_mean.device.type == "cpu"  # buffers are built for real
    assert seen["other"] == "cpu"
    assert nn.Linear(8, 8).weight.device.type == "cpu"
    assert nn.Module.register_parameter is torch_register_parameter


def test_parameters_on_meta_keeps_another_librarys_patch():
    """A patch of register_parameter in place before (as accelerate's init_empty_weights
    makes one) is called inside and put back after; one made inside, over this one, is
    undone by its own code and this one's by this one's."""
    calls = []

    def patch_over(previous):
        def patched(module, name, param):
            calls.append(name)
            previous(module, name, param)
        return patched

    before = patch_over(torch_register_parameter)
    nn.Module.register_parameter = before
    try:
        with parameters_on_meta():
            layer = nn.Linear(8, 8)
        assert calls == ["weight", "bias"] and layer.weight.is_meta and layer.bias.is_meta
        assert nn.Module.register_parameter is before
    finally:
        nn.Module.register_parameter = torch_register_parameter
    with parameters_on_meta():
        ours = nn.Module.register_parameter
        nn.Module.register_parameter = patch_over(ours)
        try:
            layer = nn.Linear(4, 8)
        finally:
            nn.Module.register_parameter = ours
    assert calls[2:] == ["weight", "bias"] and layer.weight.is_meta
    assert nn.Module.register_parameter is torch_register_parameter


def test_buffers_shared_between_modules_move_to_the_device_as_one_tensor():
    """load_pretrained moves the buffers the model built to the device: a tensor that
    two modules hold (a shared rotary table, say) stays one tensor there."""
    table = torch.arange(6.0)
    first, second, own = nn.Module(), nn.Module(), nn.Module()
    first.register_buffer("table", table)
    second.register_buffer("table", table)
    own.register_buffer("table", torch.ones(2))
    model = nn.Sequential(first, second, own)
    _hf._buffers_to(model, torch.device("meta"))
    assert first.table.is_meta and first.table is second.table
    assert own.table.is_meta and own.table.shape == (2,)
    assert table.device.type == "cpu"  # the caller's tensor is not changed


# --- on the GPU -----------------------------------------------------------------

@cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_round_trip_on_the_gpu_eager_and_compiled(tmp_path, dtype):
    model = small_llama(dtype=dtype).cuda()
    quantize_model(model, 128)
    folder = tmp_path / "ckpt"
    model.save_pretrained(folder)
    before = torch.cuda.memory_allocated()
    bad_config = edited_copy(folder, tmp_path / "bits", config={"bits": 3})
    missing = edited_copy(folder, tmp_path / "missing", drop=["model.norm.weight"])
    for bad in (bad_config, missing):
        with pytest.raises(ValueError):
            load_pretrained(bad, device="cuda")
        assert torch.cuda.memory_allocated() == before  # refused before any allocation
    loaded = load_pretrained(folder, device="cuda")
    assert loaded.model.layers[0].mlp.up_proj.qweight.is_cuda
    assert loaded.model.rotary_emb.inv_freq.is_cuda
    ids = prompt("cuda")
    twin = dense_twin(loaded)
    assert every_layer_within_linear_tolerance(loaded, ids) == 14
    with torch.no_grad():
        logits_within_linear_tolerance(loaded(ids).logits, twin, ids)
    # float16: the greedy sequences agree token for token; bfloat16 may break a near-tie
    # the other way (greedy_agrees_up_to_a_near_tie)
    def agree(got, want):
        if dtype == torch.float16:
            assert torch.equal(got, want)
        else:
            greedy_agrees_up_to_a_near_tie(got, want, loaded, twin)

    a = generate(loaded, ids)
    b = generate(twin, ids)
    agree(a, b)
    compiled = torch.compile(loaded, fullgraph=True)
    with torch.no_grad():
        logits_within_linear_tolerance(compiled(ids, use_cache=False).logits, twin, ids)
    # a static cache makes generate() compile the forward and run it under CUDA graphs,
    # which computes attention and the norms with other kernels than the eager twin
    c = generate(loaded, ids, cache_implementation="static")
    agree(c, b)


@cuda
def test_mixture_of_experts_on_the_gpu(tmp_path):
    model = small_moe("mixtral")
    ids = prompt()
    quantize_model(model, 128, calibration=[ids])
    model.save_pretrained(tmp_path)
    # float32 (the CUDA-core kernel): the tokens go to the experts they go to on the CPU
    loaded = load_pretrained(tmp_path, device="cuda", dtype=torch.float32)
    assert loaded.model.layers[1].mlp.experts.expert(3).w2.qweight.is_cuda
    with torch.no_grad():
        got = loaded(ids.cuda()).logits.cpu()
    logits_within_linear_tolerance(got, dense_twin(model), ids)
    assert torch.equal(generate(loaded, ids.cuda(), 8).cpu(), generate(model, ids, 8))
    # float16 (the tensor-core kernels, an expert at a time, each on its own tokens)
    half = load_pretrained(tmp_path, device="cuda", dtype=torch.float16)
    assert every_layer_within_linear_tolerance(half, ids.cuda()) > 4 * 3 * 2
    assert generate(half, ids.cuda(), 8).shape == (2, 20)


# --- the benchmark script and the example -------------------------------------------

def test_decoder_layer_bench_runs_on_a_tiny_layer():
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "decoder_layer_bench.py"), "--device", "cpu",
         "--tiny", "--trials", "2", "--repeats", "2", "--prefill", "16", "--compile"],
        capture_output=True, text=True, timeout=600, env=child_env())
    assert out.returncode == 0, out.stderr
    for mode in ("", "torch.compile: "):
        assert f"\n{mode}decode step ratio (dense / AWQ):" in out.stdout
        assert f"\n{mode}prefill ratio (AWQ / dense):" in out.stdout
    errors = [float(e) for e in re.findall(r"max rel\. error (\S+)", out.stdout)]
    assert len(errors) == 4 and max(errors) < 1e-4, out.stdout


def test_moe_bench_runs_on_a_tiny_block():
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "moe_bench.py"), "--device", "cpu", "--tiny",
         "--trials", "2", "--repeats", "2", "--tokens", "1,16"],
        capture_output=True, text=True, timeout=600, env=child_env())
    assert out.returncode == 0, out.stderr
    rows = re.findall(r"^tokens (\d+): dense \S+ us, dense unfused \S+ us, AWQ \S+ us, "
                      r"dense / AWQ \S+, dense unfused / AWQ \S+; max rel\. error (\S+)$",
                      out.stdout, re.M)
    assert [int(t) for t, _ in rows] == [1, 16], out.stdout
    assert max(float(e) for _, e in rows) < 1e-4, out.stdout


def test_pytorch_usage_example_runs():
    out = subprocess.run([sys.executable, str(REPO / "examples" / "pytorch_usage.py")],
                         capture_output=True, text=True, timeout=600, env=child_env())
    assert out.returncode == 0, out.stderr
    assert out.stdout.rstrip().endswith("OK")
