"""fuse_projections: AWQ layers called in a row with one input, computed by one call."""

import copy

import pytest

import awq_fast_dequant as awq

from conftest import assert_linear_close, capture_cuda_graph

torch = pytest.importorskip("torch", reason="needs torch")
nn = torch.nn
from awq_fast_dequant.torch import (  # noqa: E402
    AWQLinear, fuse_projections, quantize_model, unfuse_projections)
from awq_fast_dequant.torch import _module  # noqa: E402

HAS_CUDA = awq.cuda_available() and torch.cuda.is_available()
cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=cuda)]
BUFFERS = ("qweight", "qzeros", "scales", "bias")


class Block(nn.Module):
    """Attention-shaped projections around a gated MLP: q, k, v take one input, o
    another of the same width; gate and up take one input, down another."""

    def __init__(self, bias=False):
        super().__init__()
        self.q = nn.Linear(256, 256, bias=bias)
        self.k = nn.Linear(256, 128, bias=bias)
        self.v = nn.Linear(256, 128, bias=bias)
        self.o = nn.Linear(256, 256, bias=bias)
        self.gate = nn.Linear(256, 512, bias=bias)
        self.up = nn.Linear(256, 512, bias=bias)
        self.down = nn.Linear(512, 256, bias=bias)

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        h = x + self.o(q * torch.cat([k, v], dim=-1).sigmoid())
        return h + self.down(nn.functional.silu(self.gate(h)) * self.up(h))


def quantized_block(dtype=torch.float32, device="cpu", bias=False, seed=0):
    torch.manual_seed(seed)
    model = Block(bias).to(device, dtype)
    assert quantize_model(model, 128) == []
    return model


def example(dtype=torch.float32, device="cpu", seed=1, rows=3):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 256, generator=gen).to(device, dtype)


def assert_layer_close(y, layer, x):
    assert_linear_close(y, x, layer.qweight.contiguous(), layer.qzeros.contiguous(),
                        layer.scales.contiguous(),
                        None if layer.bias is None else layer.bias.contiguous(),
                        layer.group_size)


def count_calls(monkeypatch):
    calls = []
    real = _module._linear

    def counted(x, qweight, *rest, **kw):
        calls.append(qweight.shape[1] * 8)
        return real(x, qweight, *rest, **kw)

    monkeypatch.setattr(_module, "_linear", counted)
    # every call through forward, where _linear is counted (not linear() from C)
    monkeypatch.setattr(_module, "_module_call", lambda layer, args, kwargs: NotImplemented)
    return calls


def test_fuses_the_layers_that_take_one_input_and_no_others():
    model = quantized_block()
    groups = fuse_projections(model, example())
    assert groups == [("q", "k", "v"), ("gate", "up")]
    assert model.o._siblings is None and model.down._siblings is None
    assert model.q._siblings is model.k._siblings is model.v._siblings
    assert model.gate._siblings is model.up._siblings is not model.q._siblings


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_fused_layers_compute_each_layer_within_tolerance(device, bias):
    dtype = torch.float32 if device == "cpu" else torch.float16
    model = quantized_block(dtype, device, bias)
    fuse_projections(model, example(dtype, device))
    x = example(dtype, device, seed=2, rows=5)
    with torch.no_grad():
        outs = {name: getattr(model, name)(x) for name in ("q", "k", "v")}
    for name, y in outs.items():
        assert y.shape == (5, getattr(model, name).out_features)
        assert_layer_close(y, getattr(model, name), x)


def test_one_call_computes_a_group(monkeypatch):
    model = quantized_block()
    reference = copy.deepcopy(model)
    fuse_projections(model, example())
    calls = count_calls(monkeypatch)
    x = example(seed=3)
    with torch.no_grad():
        got = model(x)
    assert calls == [512, 256, 1024, 256]  # q|k|v, o, gate|up, down
    calls.clear()
    with torch.no_grad():
        want = reference(x)
    assert len(calls) == 7
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_member_called_with_another_input_computes_it(monkeypatch):
    model = quantized_block()
    fuse_projections(model, example())
    calls = count_calls(monkeypatch)
    x, other = example(seed=4), example(seed=5)
    with torch.no_grad():
        model.q(x)
        k = model.k(other)       # not what q was given: computed for `other`
        v = model.v(x)           # q's call left nothing for v: k's call replaced it
        assert_layer_close(k, model.k, other)
        assert_layer_close(v, model.v, x)
        assert len(calls) == 3
        # changed in place after q's call: v's part of it is stale
        calls.clear()
        y = example(seed=6)
        model.q(y)
        y.mul_(2)
        v = model.v(y)
        assert len(calls) == 2
        assert_layer_close(v, model.v, y)
        # a tensor unchanged since q's call: v's part of it
        calls.clear()
        z = example(seed=7)
        model.q(z)
        v2 = model.v(z)
        assert len(calls) == 1
        assert_layer_close(v2, model.v, z)
        v = model.v(z)  # taken: computed again
        assert len(calls) == 2
        torch.testing.assert_close(v2, v, rtol=0, atol=0)


def test_a_part_computed_without_grad_is_not_given_to_a_call_that_records_it():
    model = quantized_block()
    fuse_projections(model, example())
    x = example(seed=6).requires_grad_()
    with torch.no_grad():
        model.q(x)
    k = model.k(x)
    assert k.requires_grad
    k.sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


def test_gradients_through_a_fused_group_are_those_of_the_layers():
    model = quantized_block()
    reference = copy.deepcopy(model)
    fuse_projections(model, example())
    xa, xb = example(seed=7).requires_grad_(), example(seed=7).requires_grad_()
    model(xa).pow(2).sum().backward()
    reference(xb).pow(2).sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-4, atol=1e-5)


def test_a_members_output_may_be_changed_in_place_while_recording():
    # as an in-place activation does; autograd refuses that on the views of one split
    model = quantized_block()
    reference = copy.deepcopy(model)
    fuse_projections(model, example())
    grads = []
    for m in (model, reference):
        x = example(seed=23).requires_grad_()
        q, k = m.q(x), m.k(x)
        q.mul_(2)
        nn.functional.silu(k, inplace=True)
        (q.sum() + k.pow(2).sum() + m.v(x).sum()).backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-5)


def test_a_members_buffer_made_trainable_after_fusing_gets_its_gradient():
    model = quantized_block(bias=True)
    reference = copy.deepcopy(model)
    fuse_projections(model, example())
    for m in (model, reference):
        m.k.scales.requires_grad_()
        m.v.bias.requires_grad_()
        x = example(seed=24)
        (m.q(x).sum() + m.k(x).pow(2).sum() + m.v(x).pow(2).sum()).backward()
    for name in ("k.scales", "v.bias"):
        got, want = model.get_buffer(name).grad, reference.get_buffer(name).grad
        assert got is not None, name
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    # unfused, each keeps requires_grad, as a buffer of its own (no autograd history)
    unfuse_projections(model)
    assert model.k.scales.requires_grad and model.k.scales.is_leaf
    assert not model.q.scales.requires_grad


def test_a_bias_made_an_nn_parameter_leaves_the_group_unfused():
    model = quantized_block(bias=True)
    model.k.bias = nn.Parameter(model.k._buffers.pop("bias"))
    groups = fuse_projections(model, example())
    assert groups == [("gate", "up")]
    for name in ("q", "k", "v"):
        layer = getattr(model, name)
        assert layer._siblings is None and layer.qweight.is_contiguous(), name


def test_weights_loaded_between_member_calls_are_used_by_the_next_member():
    model = quantized_block()
    other = quantized_block(seed=25)
    fuse_projections(model, example())
    x = example(seed=26)
    with torch.no_grad():
        model.q(x)
        model.load_state_dict(other.state_dict())
        assert_layer_close(model.k(x), other.k, x)


def test_state_dict_is_the_unfused_models_and_shares_no_memory():
    model = quantized_block(bias=True)
    want = {k: v.clone() for k, v in model.state_dict().items()}
    fuse_projections(model, example())
    assert not model.q.qweight.is_contiguous()  # a view into the group's buffer
    got = model.state_dict()
    assert got.keys() == want.keys()
    for key, t in got.items():
        assert t.is_contiguous() and torch.equal(t, want[key]), key
    pointers = [t.untyped_storage().data_ptr() for t in got.values()]
    assert len(set(pointers)) == len(pointers)


def test_load_state_dict_into_a_fused_model_writes_through_to_the_group():
    model = quantized_block(bias=True)
    other = quantized_block(bias=True, seed=9)
    fuse_projections(model, example())
    model.load_state_dict(other.state_dict())
    assert model.q._siblings is not None
    x = example(seed=10)
    with torch.no_grad():
        torch.testing.assert_close(model(x), other(x), rtol=1e-5, atol=1e-5)


def test_load_state_dict_with_assign_unfuses_the_group():
    model = quantized_block()
    other = quantized_block(seed=11)
    fuse_projections(model, example())
    model.load_state_dict(other.state_dict(), assign=True)
    x = example(seed=12)
    with torch.no_grad():
        got = model(x)
        torch.testing.assert_close(got, other(x), rtol=0, atol=0)
    assert all(getattr(model, n)._siblings is None for n in ("q", "k", "v", "gate", "up"))


def test_assigning_a_buffer_unfuses_the_group_first():
    model = quantized_block()
    other = quantized_block(seed=19)
    fuse_projections(model, example())
    model.k.qweight = other.k.qweight.clone()
    model.v.register_buffer("scales", other.v.scales.clone())
    assert all(getattr(model, n)._siblings is None for n in ("q", "k", "v"))
    assert model.gate._siblings is not None
    assert all(getattr(model, n).qweight.is_contiguous() for n in ("q", "k", "v"))
    x = example(seed=20)
    with torch.no_grad():
        model.q(x)
        for name in ("k", "v"):
            assert_layer_close(getattr(model, name)(x), getattr(model, name), x)
    assert torch.equal(model.k.qweight, other.k.qweight)


def test_a_buffer_replaced_behind_the_modules_back_is_seen_at_the_next_call():
    # as code that writes _buffers itself does (accelerate's device hooks)
    model = quantized_block()
    other = quantized_block(seed=21)
    fuse_projections(model, example())
    model.v._buffers["qweight"] = other.v.qweight.clone()
    x = example(seed=22)
    with torch.no_grad():
        y = model.q(x)
        v = model.v(x)
    assert model.q._siblings is None and model.v._siblings is None
    assert_layer_close(y, model.q, x)
    assert_layer_close(v, model.v, x)
    assert torch.equal(model.v.qweight, other.v.qweight)


def test_a_conversion_unfuses_and_the_layers_own_their_buffers():
    model = quantized_block()
    fuse_projections(model, example())
    model.half()
    for name in ("q", "k", "v", "gate", "up"):
        layer = getattr(model, name)
        assert layer._siblings is None
        assert all(getattr(layer, b) is None or getattr(layer, b).is_contiguous()
                   for b in BUFFERS)
        assert layer.scales.dtype == torch.float16
    x = example(torch.float16, seed=13)
    with torch.no_grad():
        assert_layer_close(model.k(x), model.k, x)


def test_a_conversion_that_changes_nothing_keeps_the_groups():
    model = quantized_block()
    fuse_projections(model, example())
    model.to("cpu", torch.float32)
    assert model.q._siblings is not None


def test_unfuse_gives_back_the_layers_bit_for_bit():
    model = quantized_block()
    reference = copy.deepcopy(model)
    fuse_projections(model, example())
    unfuse_projections(model)
    x = example(seed=14)
    for name in ("q", "k", "v", "gate", "up"):
        layer = getattr(model, name)
        assert layer._siblings is None
        assert all(getattr(layer, b) is None or getattr(layer, b).is_contiguous()
                   for b in BUFFERS)
    with torch.no_grad():
        assert torch.equal(model(x), reference(x))


def test_a_shallow_copy_of_a_member_outlives_its_group():
    model = quantized_block()
    fuse_projections(model, example())
    k = copy.copy(model.k)
    unfuse_projections(model)
    x = example(seed=24)
    with torch.no_grad():
        y = k(x)
    assert k._siblings is None
    assert_layer_close(y, k, x)


def test_fusing_again_refuses_nothing_and_deepcopy_keeps_the_groups():
    model = quantized_block()
    fuse_projections(model, example())
    assert fuse_projections(model, example()) == [("q", "k", "v"), ("gate", "up")]
    twin = copy.deepcopy(model)
    assert twin.q._siblings is twin.k._siblings is not model.q._siblings
    x = example(seed=15)
    with torch.no_grad():
        assert torch.equal(twin(x), model(x))
    # the copy's views share the copy's group buffer, not the original's
    twin.q.qweight.zero_()
    with torch.no_grad():
        assert not torch.equal(twin.q(x), model.q(x))


def test_layers_that_differ_are_not_fused():
    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = AWQLinear.from_linear(nn.Linear(256, 128), 128)
            self.b = AWQLinear.from_linear(nn.Linear(256, 128, bias=False), 128)   # no bias
            self.c = AWQLinear.from_linear(nn.Linear(256, 64), 64)                 # other G

        def forward(self, x):
            return self.a(x).sum() + self.b(x).sum() + self.c(x).sum()

    assert fuse_projections(Mixed(), torch.randn(2, 256)) == []


def test_errors():
    with pytest.raises(TypeError, match="nn.Module"):
        fuse_projections("model")
    with pytest.raises(TypeError, match="example"):
        fuse_projections(quantized_block())
    with pytest.raises(TypeError, match="nn.Module"):
        unfuse_projections(None)
    assert fuse_projections(nn.Sequential(nn.Linear(4, 4)), torch.randn(1, 4)) == []


def test_compile_fullgraph_calls_the_op_once_a_group():
    model = quantized_block()
    fuse_projections(model, example())
    counts = []

    def backend(gm, example_inputs):
        counts.append(sum(node.target is torch.ops.awq_fast_dequant.linear.default
                          for node in gm.graph.nodes))
        return gm.forward

    x = example(seed=16)
    with torch.no_grad():
        want = model(x)
        got = torch.compile(model, fullgraph=True, backend=backend)(x)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        inductor = torch.compile(model, fullgraph=True)(x)
    torch.testing.assert_close(inductor, want, rtol=1e-5, atol=1e-5)
    assert counts == [4]
    assert not model.q._siblings.pending  # every part taken


@pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])
def test_torch_export_of_a_fused_model_holds_the_layers_own_buffers(strict):
    model = quantized_block()
    fuse_projections(model, example())
    x = example(seed=23)
    if strict and not hasattr(torch.compiler, "_is_exporting_flag"):
        pytest.skip(f"torch {torch.__version__} cannot tell strict export from torch.compile")
    program = torch.export.export(model, (x,), strict=strict)
    ops = [n for n in program.graph.nodes
           if n.target is torch.ops.awq_fast_dequant.linear.default]
    assert len(ops) == 7  # each layer from its own buffers: no concatenated constants
    assert not program.constants
    assert program.state_dict.keys() == model.state_dict().keys()
    with torch.no_grad():
        torch.testing.assert_close(program.module()(x), model(x), rtol=1e-5, atol=1e-5)
    assert model.q._siblings is not None and not model.q._siblings.pending


@cuda
def test_cuda_graph_replays_a_fused_model():
    model = quantized_block(torch.float16, "cuda")
    fuse_projections(model, example(torch.float16, "cuda"))
    x = example(torch.float16, "cuda", seed=17)
    with torch.no_grad():
        want = model(x)
        graph, out = capture_cuda_graph(lambda: model(x))
        x.copy_(example(torch.float16, "cuda", seed=18))
        graph.replay()
        fresh = model(x)
    torch.cuda.synchronize()
    assert torch.equal(out, fresh)
    assert not torch.equal(out, want)


def test_transformers_llama_fuses_by_its_dummy_inputs(tmp_path):
    transformers = pytest.importorskip("transformers", minversion="5",
                                       reason="needs transformers 5 or later")
    from awq_fast_dequant.torch import load_pretrained
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=256, intermediate_size=512,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=300)
    model = transformers.LlamaForCausalLM(config).eval()
    quantize_model(model, 128)
    model.save_pretrained(tmp_path)
    reference = copy.deepcopy(model)
    groups = fuse_projections(model)
    assert len(groups) == 4
    assert groups[0] == tuple(f"model.layers.0.self_attn.{p}_proj" for p in "qkv")
    assert groups[1] == ("model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj")
    ids = torch.randint(0, 300, (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, rtol=1e-4,
                                   atol=1e-4)
    loaded = load_pretrained(tmp_path)
    assert loaded.model.layers[1].mlp.up_proj._siblings is not None
    plain = load_pretrained(tmp_path, fuse=False)
    assert plain.model.layers[1].mlp.up_proj._siblings is None
    same = dict(do_sample=False, max_new_tokens=12)
    assert torch.equal(loaded.generate(ids, **same), plain.generate(ids, **same))
