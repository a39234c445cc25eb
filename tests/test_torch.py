"""awq_fast_dequant.torch: the registered ops (opcheck, torch.compile, CUDA graphs),
AWQLinear, quantize_model; the core package without torch."""

import importlib
import io
import logging
import pathlib
import re
import subprocess
import sys

import pytest

import awq_fast_dequant as awq

from conftest import assert_linear_close, child_env

torch = pytest.importorskip("torch", reason="needs torch")
nn = torch.nn
from awq_fast_dequant.torch import AWQLinear, quantize_model  # noqa: E402

OPS = torch.ops.awq_fast_dequant
REVERSE = (0, 4, 1, 5, 2, 6, 3, 7)
HAS_CUDA = awq.cuda_available() and torch.cuda.is_available()
cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
CPU_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
CUDA_DTYPES = (torch.float16, torch.bfloat16)


def layer_tensors(K, N, G, dtype=torch.float16, device="cpu", seed=0, bias=True):
    """Random qweight / qzeros (every bit pattern), finite scales of both signs, and a bias."""
    gen = torch.Generator().manual_seed(seed)
    words = lambda *shape: torch.randint(-2**31, 2**31, shape, generator=gen, dtype=torch.int64)
    qweight = words(K, N // 8).to(torch.int32)
    qzeros = words(K // G, N // 8).to(torch.int32)
    scales = (torch.randn(K // G, N, generator=gen) * 0.02).to(dtype)
    b = (torch.randn(N, generator=gen) * 0.1).to(dtype) if bias else None
    move = lambda t: None if t is None else t.to(device)
    return move(qweight), move(qzeros), move(scales), move(b)


def nibbles(words):
    """int32 [R, C] -> int64 [R, 8C] of 4-bit values, columns in AWQ order (written from DESIGN.md)."""
    shifts = torch.tensor([4 * r for r in REVERSE], device=words.device)
    return ((words.long().unsqueeze(-1) >> shifts) & 0xF).reshape(words.shape[0], -1)


def reference_weight(qweight, qzeros, scales, dtype=None):
    """W [K, N] = round_to_dtype(float32(q - z) * float32(s)), computed here in torch."""
    G = qweight.shape[0] // scales.shape[0]
    q = nibbles(qweight.cpu())
    z = nibbles(qzeros.cpu()).repeat_interleave(G, dim=0)
    s = scales.cpu().float().repeat_interleave(G, dim=0)
    return ((q - z).float() * s).to(scales.dtype if dtype is None else dtype)


def make_awq(K=256, N=64, G=128, dtype=torch.float16, device="cpu", seed=0, bias=True):
    return AWQLinear.from_tensors(*layer_tensors(K, N, G, dtype, device, seed, bias))


# --- the core package stays torch-free ---------------------------------------

def test_core_package_does_not_import_torch():
    code = "import sys, awq_fast_dequant; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=child_env(), cwd="/", check=True)
    assert out.stdout.strip() == "False"


def test_the_integration_imports_the_real_torch():
    from awq_fast_dequant.torch import _ops, _module, _hf

    for mod in (_ops, _module, _hf):
        assert mod.torch is sys.modules["torch"] and hasattr(mod.torch, "library")


def test_the_integration_refuses_a_torch_older_than_2_5():
    code = ("import torch; torch.__version__ = '2.4.1+cu121'\n"
            "try:\n    import awq_fast_dequant.torch\n"
            "except ImportError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=child_env(), cwd="/", check=True)
    assert out.stdout.strip() == ("awq_fast_dequant.torch needs torch >= 2.5; this is torch "
                                  "2.4.1+cu121 (pip install 'torch>=2.5')")


# --- the registered ops -------------------------------------------------------

def test_ops_are_registered_with_their_schemas():
    assert str(OPS.dequantize.default._schema) == (
        "awq_fast_dequant::dequantize(Tensor qweight, Tensor qzeros, Tensor scales, "
        "int? group_size=None, ScalarType? out_dtype=None) -> Tensor")
    assert "Tensor(a!) out" in str(OPS.dequantize_out.default._schema)
    assert str(OPS.linear.default._schema) == (
        "awq_fast_dequant::linear(Tensor x, Tensor qweight, Tensor qzeros, Tensor scales, "
        "Tensor? bias=None, int? group_size=None) -> Tensor")


def opcheck_all(device, dtype):
    qweight, qzeros, scales, bias = layer_tensors(256, 64, 64, dtype, device)
    x = torch.randn(3, 5, 256, dtype=dtype, device=device)
    out = torch.empty(256, 64, dtype=torch.float32, device=device)
    cases = [
        (OPS.dequantize.default, (qweight, qzeros, scales, None, None)),
        (OPS.dequantize.default, (qweight, qzeros, scales, 64, torch.float32)),
        (OPS.dequantize_out.default, (qweight, qzeros, scales, out, 64)),
        (OPS.linear.default, (x, qweight, qzeros, scales, bias, 64)),
        (OPS.linear.default, (x[0], qweight, qzeros, scales, None, None)),
        # gradients: through x, scales and bias
        (OPS.linear.default, (x.clone().requires_grad_(), qweight, qzeros,
                              scales.clone().requires_grad_(), bias.clone().requires_grad_(), 64)),
        (OPS.dequantize.default, (qweight, qzeros, scales.clone().requires_grad_(), 64, None)),
    ]
    for op, args in cases:
        results = torch.library.opcheck(op, args)
        assert set(results.values()) == {"SUCCESS"}, (op, results)


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
def test_opcheck_cpu(dtype):
    opcheck_all("cpu", dtype)


@cuda
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=str)
def test_opcheck_cuda(dtype):
    opcheck_all("cuda", dtype)


def bits(t):
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


@pytest.mark.parametrize("out_dtype", [None, torch.float32, torch.bfloat16], ids=str)
def test_dequantize_op_is_the_contract(out_dtype):
    qweight, qzeros, scales, _ = layer_tensors(128, 136, 32, torch.float16)
    got = OPS.dequantize(qweight, qzeros, scales, 32, out_dtype)
    want = reference_weight(qweight, qzeros, scales, out_dtype)
    assert got.dtype == want.dtype and torch.equal(bits(got), bits(want))


def test_dequantize_out_op_writes_out_and_rejects_bad_out():
    qweight, qzeros, scales, _ = layer_tensors(128, 64, 64, torch.bfloat16)
    out = torch.full((128, 64), 7.0, dtype=torch.float32)
    OPS.dequantize_out(qweight, qzeros, scales, out)
    assert torch.equal(out, reference_weight(qweight, qzeros, scales, torch.float32))
    bad = torch.full((64, 128), 7.0, dtype=torch.float32)
    with pytest.raises(ValueError, match="out"):
        OPS.dequantize_out(qweight, qzeros, scales, bad)
    assert torch.all(bad == 7.0)


def test_dequantize_out_op_bumps_the_version_of_out_once():
    """As torch's own out= ops do, with or without grad mode and in inference mode
    (for tensors made outside it), so that autograd refuses values it saved before."""
    qweight, qzeros, scales, _ = layer_tensors(128, 64, 64)
    want = reference_weight(qweight, qzeros, scales)
    for context in (torch.enable_grad, torch.no_grad, torch.inference_mode):
        out = torch.zeros(128, 64, dtype=torch.float16)
        with context():
            OPS.dequantize_out(qweight, qzeros, scales, out)
        assert out._version == 1 and torch.equal(out, want), context
    bad = torch.zeros(64, 128, dtype=torch.float16)
    with pytest.raises(ValueError, match="out"):
        OPS.dequantize_out(qweight, qzeros, scales, bad)
    assert bad._version == 0 and torch.all(bad == 0)
    with torch.inference_mode():
        fresh = torch.empty(128, 64, dtype=torch.float16)  # an inference tensor: no version
        OPS.dequantize_out(qweight, qzeros, scales, fresh)
    assert torch.equal(fresh, want)

    a = torch.randn(128, 64, requires_grad=True)
    buf = torch.ones(128, 64)
    y = (a * buf).sum()  # saves buf for the gradient of a
    with torch.inference_mode():
        OPS.dequantize_out(qweight, qzeros, scales, buf)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
def test_linear_op_within_tolerance(dtype):
    qweight, qzeros, scales, bias = layer_tensors(384, 72, 128, dtype)
    x = torch.randn(2, 3, 384).to(dtype)
    assert_linear_close(OPS.linear(x, qweight, qzeros, scales, bias, 128),
                        x, qweight, qzeros, scales, bias)
    # non-contiguous x is made contiguous by the op
    xt = torch.randn(384, 4).to(dtype).t()
    assert_linear_close(OPS.linear(xt, qweight, qzeros, scales, None), xt, qweight, qzeros, scales,
                        None)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
def test_ops_call_the_kernel_directly_only_for_plain_tensors(monkeypatch, device):
    """Without gradients, on plain tensors and with no mode active, the autograd kernel
    calls the C extension itself; a fake tensor (what torch.compile traces with) and a
    call that needs gradients go through the dispatcher below autograd."""
    from awq_fast_dequant.torch import _ops
    from torch._subclasses.fake_tensor import FakeTensorMode

    redispatched = []
    real = _ops._below_autograd
    monkeypatch.setattr(_ops, "_below_autograd",
                        lambda op, *a: redispatched.append(op) or real(op, *a))
    dtype = torch.float32 if device == "cpu" else torch.float16
    qweight, qzeros, scales, bias = layer_tensors(256, 64, 128, dtype, device)
    x = torch.randn(3, 256).to(device=device, dtype=dtype)
    with torch.no_grad():
        y = OPS.linear(x, qweight, qzeros, scales, bias, 128)
        w = OPS.dequantize(qweight, qzeros, scales, 128, None)
    assert redispatched == []
    assert_linear_close(y, x, qweight, qzeros, scales, bias)
    assert torch.equal(w.cpu(), reference_weight(qweight, qzeros, scales))
    assert torch.equal(OPS.linear(x, qweight, qzeros, scales, bias, 128), y)  # grad mode, none needed
    assert redispatched == []

    OPS.linear(x.clone().requires_grad_(), qweight, qzeros, scales, bias, 128)
    assert redispatched == [_ops._LINEAR]
    with FakeTensorMode() as mode:
        fakes = [mode.from_tensor(t) for t in (x, qweight, qzeros, scales, bias)]
        with torch.no_grad():
            y = OPS.linear(*fakes, 128)
            w = OPS.dequantize(*fakes[1:4], 128, torch.bfloat16)
    assert y.shape == (3, 64) and y.dtype == dtype and y.device.type == device
    assert w.shape == (256, 64) and w.dtype == torch.bfloat16
    assert redispatched == [_ops._LINEAR, _ops._LINEAR, _ops._DEQUANTIZE]


def test_op_gradients_match_a_dense_float32_model():
    qweight, qzeros, scales, bias = layer_tensors(256, 64, 64, torch.float32)
    x = torch.randn(2, 5, 256)

    def run(fn):
        xs, ss, bs = (t.clone().requires_grad_() for t in (x, scales, bias))
        y = fn(xs, ss, bs)
        (y * torch.linspace(-1, 1, y.numel()).reshape(y.shape)).sum().backward()
        return xs.grad, ss.grad, bs.grad

    def dense(xs, ss, bs):  # the same function written with torch ops: W = (q - z) * s
        offsets = (nibbles(qweight) - nibbles(qzeros).repeat_interleave(64, 0)).float()
        return xs @ (offsets * ss.repeat_interleave(64, 0)) + bs

    got = run(lambda xs, ss, bs: OPS.linear(xs, qweight, qzeros, ss, bs, 64))
    want = run(dense)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    gw = run(lambda xs, ss, bs: xs @ OPS.dequantize(qweight, qzeros, ss, 64, None) + bs)
    torch.testing.assert_close(gw[1], want[1], rtol=1e-5, atol=1e-5)


def dense_weight(qweight, qzeros, scales):
    """W [K, N] = (q - z) * s in float32 torch ops, differentiable in the scales."""
    G = qweight.shape[0] // scales.shape[0]
    offsets = (nibbles(qweight) - nibbles(qzeros).repeat_interleave(G, 0)).float()
    return offsets * scales.float().repeat_interleave(G, 0)


def test_op_forward_mode_tangents_match_a_dense_float32_model():
    """forward_ad tangents of x, scales and bias, each alone and all together, are those
    of x @ W + bias written with torch ops; dequantize's tangent in the scales too."""
    import torch.autograd.forward_ad as fwAD

    qweight, qzeros, scales, bias = layer_tensors(256, 64, 64, torch.float32)
    x = torch.randn(2, 5, 256)
    gen = torch.Generator().manual_seed(1)
    tangents = [torch.randn(t.shape, generator=gen) for t in (x, scales, bias)]

    def jvp(fn, which):
        with fwAD.dual_level():
            args = [fwAD.make_dual(t, dt) if i in which else t
                    for i, (t, dt) in enumerate(zip((x, scales, bias), tangents))]
            primal, tangent = fwAD.unpack_dual(fn(*args))
        assert tangent is not None, which
        return primal, tangent

    dense = lambda xs, ss, bs: xs @ dense_weight(qweight, qzeros, ss) + bs
    for which in ({0}, {1}, {2}, {0, 1, 2}):
        primal, got = jvp(lambda xs, ss, bs: OPS.linear(xs, qweight, qzeros, ss, bs, 64), which)
        assert torch.equal(primal, OPS.linear(x, qweight, qzeros, scales, bias, 64))
        torch.testing.assert_close(got, jvp(dense, which)[1], rtol=1e-5, atol=1e-5)
    _, got = jvp(lambda xs, ss, bs: OPS.dequantize(qweight, qzeros, ss, 64, torch.bfloat16), {1})
    assert got.dtype == torch.bfloat16
    want = dense_weight(qweight, qzeros, tangents[1]).bfloat16()
    assert torch.equal(got, want)  # linear in the scales: dequantize of their tangent
    with fwAD.dual_level(), pytest.raises(RuntimeError, match="forward-mode tangent"):
        OPS.dequantize_out(qweight, qzeros, fwAD.make_dual(scales, tangents[1]),
                           torch.empty(256, 64), 64)


# Inputs the C core refuses: (op, which argument to replace, with what, the exception).
BAD_OP_CALLS = [
    ("linear", 0, lambda x: torch.randn(4, 100), ValueError),             # K
    ("linear", 0, lambda x: x.double(), TypeError),                        # x's dtype
    ("linear", 0, lambda x: x[0, 0], ValueError),                          # 0-D x
    ("linear", 1, lambda qw: qw.float(), TypeError),                       # packed words
    ("linear", 2, lambda qz: qz[:, :4].contiguous(), ValueError),          # qzeros' columns
    ("linear", 3, lambda s: s.half(), TypeError),                          # scales vs x
    ("linear", 3, lambda s: s[:1].contiguous(), ValueError),               # rows
    ("linear", 4, lambda b: b[:8].contiguous(), ValueError),               # bias' shape
    ("linear", 4, lambda b: b.half(), TypeError),                          # bias' dtype
    ("linear", 5, lambda g: 64, ValueError),                               # group_size
    ("dequantize", 0, lambda qw: qw[0].contiguous(), ValueError),          # 1-D qweight
    ("dequantize", 2, lambda s: s.int(), TypeError),                       # scales' dtype
    ("dequantize", 4, lambda d: torch.float64, TypeError),                 # out_dtype
    ("dequantize_out", 3, lambda out: out.t().contiguous(), ValueError),   # out's shape
    ("dequantize_out", 3, lambda out: out.int(), TypeError),               # out's dtype
    ("dequantize_out", 3, lambda out: out.t().contiguous().t(), ValueError),  # out's strides
]


@pytest.mark.parametrize("case", range(len(BAD_OP_CALLS)))
def test_fake_and_meta_kernels_refuse_what_the_kernels_refuse(case):
    """The same exception, word for word, from the real kernel, on meta tensors and under
    FakeTensorMode: a meta layer or a traced program fails where eager mode fails."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    name, index, change, error = BAD_OP_CALLS[case]
    qweight, qzeros, scales, bias = layer_tensors(256, 64, 128, torch.float32)
    args = {"linear": [torch.randn(4, 256), qweight, qzeros, scales, bias, 128],
            "dequantize": [qweight, qzeros, scales, 128, None],
            "dequantize_out": [qweight, qzeros, scales, torch.empty(256, 64), 128]}[name]
    args[index] = change(args[index])
    op = getattr(OPS, name).default
    with pytest.raises(error) as real:
        op(*args)
    meta = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
    with pytest.raises(error) as on_meta:
        op(*meta)
    with FakeTensorMode() as mode, pytest.raises(error) as fake:
        op(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args])
    assert str(on_meta.value) == str(fake.value) == str(real.value)


def test_meta_layer_and_export_refuse_x_of_the_wrong_width():
    meta = AWQLinear(256, 64, 128, dtype=torch.bfloat16, device="meta")
    with pytest.raises(ValueError, match="x's last dimension must be K = 256"):
        meta(torch.randn(4, 100, dtype=torch.bfloat16, device="meta"))
    with pytest.raises(TypeError, match="scales must have x's dtype float32"):
        meta(torch.randn(4, 256, device="meta"))
    layer = make_awq(dtype=torch.float32)
    with pytest.raises(ValueError, match="x's last dimension must be K = 256"):
        # non-strict (the default of newer torch; strict export wraps the error in its own)
        torch.export.export(layer, (torch.randn(4, 100),), strict=False)


def graph_ops(gm):
    """The ops a traced graph calls, as packets (torch.ops.ns.name)."""
    return {getattr(n.target, "_overloadpacket", n.target) for n in gm.graph.nodes
            if n.op == "call_function"}


def test_compile_fullgraph_functions_calling_each_op():
    qweight, qzeros, scales, bias = layer_tensors(256, 64, 64, torch.float32)
    x = torch.randn(4, 256)
    seen = set()

    def backend(gm, example_inputs):  # records what dynamo traced, then compiles it
        seen.update(graph_ops(gm))
        from torch._inductor import compile_fx

        return compile_fx.compile_fx(gm, example_inputs)

    def f(x, qweight, qzeros, scales, bias, out):
        w = OPS.dequantize(qweight, qzeros, scales, 64, torch.bfloat16)
        OPS.dequantize_out(qweight, qzeros, scales, out, 64)
        y = OPS.linear(x, qweight, qzeros, scales, bias, 64)
        return torch.relu(y) + 1, w.float() * 2

    out_c, out_e = torch.empty(256, 64), torch.empty(256, 64)
    compiled = torch.compile(f, fullgraph=True, backend=backend)
    with torch.no_grad():
        got = compiled(x, qweight, qzeros, scales, bias, out_c)
        want = f(x, qweight, qzeros, scales, bias, out_e)
    assert {OPS.dequantize, OPS.dequantize_out, OPS.linear} <= seen
    assert torch.equal(got[1], want[1]) and torch.equal(out_c, out_e)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)


def test_compile_fullgraph_module_with_awq_linear():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 128), nn.GELU(), nn.Linear(128, 64), nn.LayerNorm(64))
    assert quantize_model(model, 64) == []
    x = torch.randn(2, 7, 256)
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        want = model(x)
        torch.testing.assert_close(compiled(x), want, rtol=1e-5, atol=1e-5)
    with torch.inference_mode():
        assert torch.equal(model(x), want)
        torch.testing.assert_close(torch.compile(model, fullgraph=True)(x), want, rtol=1e-5,
                                   atol=1e-5)
    # gradients through the compiled module reach x
    xs, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    compiled(xs).pow(2).sum().backward()
    model(xe).pow(2).sum().backward()
    torch.testing.assert_close(xs.grad, xe.grad, rtol=1e-4, atol=1e-5)


EXPORT_DEVICES = ["cpu", pytest.param("cuda", marks=cuda)]


def exported_awq_model(device, quantize=True):
    """A small model with an AWQLinear (nn.Linear with quantize=False) and one input,
    exported with a dynamic batch (float32 on the CPU, float16 on CUDA)."""
    torch.manual_seed(0)
    dtype = torch.float32 if device == "cpu" else torch.float16
    model = nn.Sequential(nn.Linear(256, 128), nn.GELU(), nn.Linear(128, 64)).to(device, dtype)
    if quantize:
        assert quantize_model(model, 64) == []
    x = torch.randn(3, 256, device=device, dtype=dtype)
    program = torch.export.export(model, (x,), dynamic_shapes=({0: torch.export.Dim("batch")},))
    return model, program


@pytest.mark.parametrize("device", EXPORT_DEVICES)
def test_torch_export_traces_awq_linear_to_the_linear_op(tmp_path, device):
    model, program = exported_awq_model(device)
    calls = [n.target for n in program.graph.nodes if n.op == "call_function"]
    assert calls.count(OPS.linear.default) == 2
    torch.export.save(program, tmp_path / "model.pt2")
    loaded = torch.export.load(tmp_path / "model.pt2")
    for batch in (3, 5):  # the traced batch and another
        x = torch.randn(batch, 256, device=device, dtype=model[0].scales.dtype)
        with torch.no_grad():
            want = model(x)
        assert torch.equal(program.module()(x), want)
        assert torch.equal(loaded.module()(x), want)


# AOTInductor in a child process: a crash in torch's loader must not take the whole
# pytest run down with it. The child compiles the model of exported_awq_model (or the
# same model left dense, with "dense"), loads the package and checks runner(x)
# against model(x); its own kernels for the rest of the model may round
# differently (float16 on CUDA).
AOTI_CHILD = """
import sys
import torch
sys.path.insert(0, sys.argv[4])
from test_torch import exported_awq_model
device, kind, folder = sys.argv[1:4]
model, program = exported_awq_model(device, quantize=kind == "awq")
package = torch._inductor.aoti_compile_and_package(program, package_path=folder + "/m.pt2")
runner = torch._inductor.aoti_load_package(package)
tol = 1e-5 if device == "cpu" else 2e-3
for batch in (3, 5):
    x = torch.randn(batch, 256, device=device, dtype=model[0].bias.dtype)
    with torch.no_grad():
        got = runner(x)
        assert got.device == x.device and got.dtype == x.dtype, (got.device, got.dtype)
        torch.testing.assert_close(got, model(x), rtol=tol, atol=tol)
print("ok")
"""


def run_aoti_child(device, kind, folder):
    folder.mkdir()
    here = str(pathlib.Path(__file__).parent)
    return subprocess.run([sys.executable, "-c", AOTI_CHILD, device, kind, str(folder), here],
                          capture_output=True, text=True, env=child_env(), cwd=str(folder),
                          timeout=900)


@pytest.mark.parametrize("device", EXPORT_DEVICES)
@pytest.mark.skipif(not hasattr(importlib.import_module("torch._inductor"),
                            "aoti_compile_and_package"),
                    reason=f"torch {torch.__version__} has no AOTInductor packages (2.6+)")
def test_aotinductor_compiles_an_exported_awq_model(tmp_path, device):
    got = run_aoti_child(device, "awq", tmp_path / "awq")
    if got.returncode < 0:  # killed by a signal: does torch's AOTInductor run at all here?
        dense = run_aoti_child(device, "dense", tmp_path / "dense")
        if dense.returncode < 0:
            pytest.skip(f"AOTInductor of torch {torch.__version__} crashes here on any "
                        f"package: signal {-got.returncode} with AWQLinear, signal "
                        f"{-dense.returncode} for the same model with nn.Linear")
    assert got.returncode == 0 and got.stdout.strip().endswith("ok"), (
        f"exit {got.returncode}\n{got.stderr[-3000:]}")


# --- AWQLinear ----------------------------------------------------------------

def test_awq_linear_buffers_are_those_of_wqlinear_gemm():
    layer = AWQLinear(512, 256, 128, bias=True, dtype=torch.float16)
    got = {k: (tuple(v.shape), v.dtype) for k, v in layer.state_dict().items()}
    assert got == {"qweight": ((512, 32), torch.int32), "qzeros": ((4, 32), torch.int32),
                   "scales": ((4, 256), torch.float16), "bias": ((256,), torch.float16)}
    assert list(AWQLinear(512, 256, -1, bias=False).state_dict()) == ["qweight", "qzeros",
                                                                       "scales"]
    assert AWQLinear(512, 256, -1).qzeros.shape == (1, 32)
    assert list(layer.parameters()) == []


def test_awq_linear_extra_repr_shows_shapes_group_and_dtype():
    text = repr(AWQLinear(512, 256, 64, bias=False, dtype=torch.bfloat16))
    for part in ("in_features=512", "out_features=256", "group_size=64", "bias=False",
                 "torch.bfloat16", "qweight=[512, 32]", "qzeros=[8, 32]", "scales=[8, 256]"):
        assert part in text


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_awq_linear_forward(dtype, bias):
    qweight, qzeros, scales, b = layer_tensors(384, 136, 64, dtype, bias=bias)
    layer = AWQLinear.from_tensors(qweight, qzeros, scales, b)
    assert layer.group_size == 64 and layer.qweight is qweight  # held, not copied
    for shape in [(384,), (5, 384), (2, 3, 384)]:
        x = torch.randn(shape).to(dtype)
        assert_linear_close(layer(x), x, qweight, qzeros, scales, b)
    xt = torch.randn(384, 3).to(dtype).t()  # non-contiguous, as nn.Linear accepts
    assert_linear_close(layer(xt), xt, qweight, qzeros, scales, b)


def test_eager_forward_calls_the_extension_and_compile_or_grad_the_op(monkeypatch):
    from awq_fast_dequant.torch import _module

    calls = []
    real = _module._ops.linear
    monkeypatch.setattr(_module._ops, "linear", lambda *a: calls.append(1) or real(*a))
    layer = make_awq(dtype=torch.float32)
    x = torch.randn(2, 256)
    layer(x)
    assert calls == []  # eager, no grad: C directly, no dispatcher
    y = layer(x.clone().requires_grad_())
    assert calls == [1] and y.requires_grad  # autograd needs the op's backward
    with torch.no_grad():
        layer(x.clone().requires_grad_())
    with torch.inference_mode():
        assert layer(x).is_inference()
    assert calls == [1]
    layer.scales.requires_grad_()
    assert layer(x).requires_grad and calls == [1, 1]


def test_awq_linear_goes_through_the_op_where_torch_must_see_it():
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import FlopCounterMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func)
            return func(*args, **(kwargs or {}))

    layer = make_awq(dtype=torch.float32)
    x = torch.randn(3, 256)
    with torch.no_grad():
        want = layer(x)
        with Seen() as mode:  # a dispatch mode sees the layer's one op
            got = layer(x)
        assert mode.ops == [OPS.linear.default] and torch.equal(got, want)
        with FlopCounterMode(display=False) as flops:  # counted as the dense matmul
            layer(x)
        assert flops.get_total_flops() == 2 * 3 * 256 * 64
        with FakeTensorMode():  # shapes only, nothing read
            fake = make_awq(dtype=torch.float32)(torch.randn(2, 5, 256))
        assert isinstance(fake, FakeTensor) and fake.shape == (2, 5, 64)
        meta = AWQLinear(256, 64, 128, dtype=torch.bfloat16, device="meta")
        y = meta(torch.randn(4, 256, dtype=torch.bfloat16, device="meta"))
        assert y.is_meta and y.shape == (4, 64) and y.dtype == torch.bfloat16
        with pytest.raises(TypeError, match="meta"):  # real x, weights never loaded
            meta(torch.randn(4, 256, dtype=torch.bfloat16))
        batched = torch.func.vmap(layer)(torch.stack([x, 2 * x]))  # x as torch.func wraps it
        assert torch.equal(batched[0], want) and torch.equal(batched[1], layer(2 * x))
        # a lazy negation (the negative bit set), which the dispatcher resolves
        assert torch.equal(layer(torch._neg_view(x)), layer(-x))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
def test_awq_linear_under_autocast_computes_in_its_own_dtype(device):
    """x of another dtype is cast to the scales' dtype, whatever autocast's dtype: the
    weights are the layer's own; the output has the scales' dtype, as without autocast."""
    layer = make_awq(dtype=torch.bfloat16, device=device)
    x = torch.randn(3, 256, device=device)
    with torch.no_grad():
        want = layer(x.bfloat16())
        for dtype in (torch.bfloat16, torch.float16):
            with torch.autocast(device, dtype=dtype):
                assert torch.equal(layer(x), want), dtype
                assert torch.equal(OPS.linear(x, layer.qweight, layer.qzeros, layer.scales,
                                              layer.bias.float(), 128), want)
                assert torch.equal(torch.compile(layer, fullgraph=True)(x), want)
        wide = make_awq(dtype=torch.bfloat16, device=device)
        wide.bias = layer.bias.float()  # a bias of another dtype is cast too
        with torch.autocast(device, dtype=torch.bfloat16):
            assert torch.equal(wide(x.bfloat16()), want)
        with pytest.raises(TypeError, match="dtype"):  # without autocast x must match
            layer(x)
        with pytest.raises(TypeError, match="bias must have"):  # and so must the bias
            wide(x.bfloat16())
    xs = x.clone().requires_grad_()
    with torch.autocast(device, dtype=torch.bfloat16):
        y = layer(xs)
    y.float().sum().backward()  # the gradient flows back through the cast, to float32
    W = layer.dequantized_weight().float()
    assert xs.grad.dtype == torch.float32
    torch.testing.assert_close(xs.grad, W.sum(dim=0).bfloat16().float().expand(3, -1),
                               rtol=2e-2, atol=1e-3)


@pytest.mark.parametrize("compiled", [False, True])
def test_gradients_are_not_autocast_when_backward_runs_under_autocast(compiled):
    """A float32 layer ignores autocast in its forward, and so its backward formulas do:
    backward() inside torch.autocast, or the backward of a graph compiled there, keeps
    float32 products (under bfloat16 autocast they would be off by about 1e-3)."""
    qweight, qzeros, scales, bias = layer_tensors(256, 64, 64, torch.float32)
    x = torch.randn(2, 5, 256)
    g = torch.linspace(-1, 1, 2 * 5 * 64).reshape(2, 5, 64)
    gw = torch.linspace(-1, 1, 256 * 64).reshape(256, 64)
    fn = lambda xs, ss: OPS.linear(xs, qweight, qzeros, ss, bias, 64)
    deq = lambda ss: OPS.dequantize(qweight, qzeros, ss, 64, None)
    xs, ss, sd = x.clone().requires_grad_(), scales.clone().requires_grad_(), \
        scales.clone().requires_grad_()
    if compiled:  # traced under autocast, forward and backward alike; no cached graph
        torch._dynamo.reset()
        fn, deq = torch.compile(fn, fullgraph=True), torch.compile(deq, fullgraph=True)
        with torch._inductor.config.patch(force_disable_caches=True):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y, w = fn(xs, ss), deq(sd)
            (y * g).sum().backward()
            (w * gw).sum().backward()
    else:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            (fn(xs, ss) * g).sum().backward()
            (deq(sd) * gw).sum().backward()
    offsets = (nibbles(qweight) - nibbles(qzeros).repeat_interleave(64, 0)).double()
    W = lambda s: offsets * s.repeat_interleave(64, 0)  # float64 reference
    s64 = scales.double()
    torch.testing.assert_close(xs.grad.double(), g.double() @ W(s64).t(), rtol=1e-5, atol=1e-5)
    want_s = torch.func.grad(lambda s: (x.double() @ W(s) * g.double()).sum())(s64)
    torch.testing.assert_close(ss.grad.double(), want_s, rtol=1e-5, atol=1e-4)
    want_d = torch.func.grad(lambda s: (W(s) * gw.double()).sum())(s64)
    torch.testing.assert_close(sd.grad.double(), want_d, rtol=1e-5, atol=1e-4)


def test_torch_func_grad_jacrev_and_per_sample_gradients():
    """torch.func's reverse-mode transforms, which cannot run an op's autograd.Function,
    go through the dense weight in differentiable ops: the gradients of a float64
    reference, per sample under vmap too."""
    from awq_fast_dequant.torch import _ops

    for dtype in CPU_DTYPES:  # the dense weight is the kernel's, bit for bit
        q, z, s, _ = layer_tensors(256, 64, 64, dtype)
        assert torch.equal(_ops._dequantize_composite(q, z, s, 64, None),
                           OPS.dequantize(q, z, s, 64, None)), dtype
    layer = make_awq(dtype=torch.float32)
    G = layer.group_size
    x = torch.randn(4, 256)
    offsets = (nibbles(layer.qweight) - nibbles(layer.qzeros).repeat_interleave(G, 0)).double()
    dense = lambda v, s: v @ (offsets * s.repeat_interleave(G, 0)) + layer.bias.double()
    s64 = layer.scales.double()
    loss = lambda y: (y ** 2).sum()

    got = torch.func.grad(lambda v: loss(layer(v)))(x)
    want = torch.func.grad(lambda v: loss(dense(v, s64)))(x.double())
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
    got = torch.func.jacrev(layer)(x[0])
    torch.testing.assert_close(got.double(), torch.func.jacrev(lambda v: dense(v, s64))(
        x[0].double()), rtol=1e-5, atol=1e-5)
    per_sample = torch.func.vmap(torch.func.grad(
        lambda s, v: loss(torch.func.functional_call(layer, {"scales": s}, (v,)))),
        in_dims=(None, 0))(layer.scales, x)
    want = torch.stack([torch.func.grad(lambda s: loss(dense(v, s)))(s64)
                        for v in x.double()])
    assert per_sample.shape == (4, *layer.scales.shape)
    torch.testing.assert_close(per_sample.double(), want, rtol=1e-4, atol=1e-3)
    got = torch.func.grad(lambda s: (OPS.dequantize(layer.qweight, layer.qzeros, s, G, None)
                                     ** 2).sum())(layer.scales)
    torch.testing.assert_close(got.double(), torch.func.grad(
        lambda s: ((offsets * s.repeat_interleave(G, 0)) ** 2).sum())(s64), rtol=1e-5,
        atol=1e-4)


def test_awq_linear_with_weights_that_are_not_contiguous():
    """Weights put in place without a copy (load_state_dict(assign=True), assignment,
    functional_call) may be views that are not contiguous: forward computes the same."""
    layer = make_awq(dtype=torch.float32)
    x = torch.randn(3, 256)
    with torch.no_grad():
        want = layer(x)
    views = {name: t.t().contiguous().t() for name, t in layer.state_dict().items()
             if t.dim() == 2}
    assert not any(v.is_contiguous() for v in views.values())
    with torch.no_grad():
        assert torch.equal(torch.func.functional_call(layer, views, (x,)), want)
        other = make_awq(dtype=torch.float32, seed=1)
        other.load_state_dict({**views, "bias": layer.bias}, assign=True)
        assert not other.qweight.is_contiguous()
        assert torch.equal(other(x), want)
        other.scales = views["scales"]
        assert torch.equal(other(x), want)
        with pytest.raises(ValueError, match="x's last dimension"):  # other errors stand
            other(x[:, :128])


def test_awq_linear_forward_mode_ad_is_that_of_its_dense_weight():
    """jacfwd (torch.func) and forward_ad's dual tensors, in eager mode, where forward
    would otherwise call the C extension, which knows nothing of tangents."""
    import torch.autograd.forward_ad as fwAD
    import torch.nn.functional as F

    torch.manual_seed(0)
    layer = AWQLinear.from_linear(nn.Linear(256, 64), 128)
    x = torch.randn(256)
    dense = lambda v: F.linear(v, layer.dequantized_weight(), layer.bias)
    jacobian = torch.func.jacfwd(layer)(x)
    assert jacobian.abs().max() > 0
    torch.testing.assert_close(jacobian, torch.func.jacfwd(dense)(x), rtol=1e-5, atol=1e-6)
    xs, v = torch.randn(3, 256), torch.randn(3, 256)
    with torch.no_grad(), fwAD.dual_level():
        primal, tangent = fwAD.unpack_dual(layer(fwAD.make_dual(xs, v)))
    assert torch.equal(primal, layer(xs))
    assert tangent is not None
    torch.testing.assert_close(tangent, v @ layer.dequantized_weight().t(), rtol=1e-5,
                               atol=1e-6)


def test_awq_linear_scales_and_bias_may_be_parameters():
    """nn.Module moves a buffer it is given an nn.Parameter for into _parameters: the
    layer computes the same, and the gradients reach the parameters."""
    layer = make_awq(dtype=torch.float32)
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = layer(x)
    layer.bias = nn.Parameter(layer.bias.clone())
    assert [name for name, _ in layer.named_parameters()] == ["bias"]
    y = layer(x)
    assert torch.equal(y, want)
    y.sum().backward()
    assert torch.equal(layer.bias.grad, torch.full((64,), 3.0))
    with torch.no_grad():
        assert torch.equal(layer(x), want)

    qweight, qzeros, scales, bias = layer_tensors(256, 64, 128, torch.float32)
    params = AWQLinear.from_tensors(qweight, qzeros, nn.Parameter(scales.clone()),
                                    nn.Parameter(bias.clone()))
    assert {name for name, _ in params.named_parameters()} == {"scales", "bias"}
    params(x).pow(2).sum().backward()
    ss, bs = scales.clone().requires_grad_(), bias.clone().requires_grad_()
    (x @ dense_weight(qweight, qzeros, ss) + bs).pow(2).sum().backward()
    # a scale's gradient sums terms that cancel: its float32 error follows the largest
    # gradient (thousands here), not its own size
    for got, want in ((params.scales.grad, ss.grad), (params.bias.grad, bs.grad)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * want.abs().max().item())


def test_awq_linear_vmap_over_stacked_buffers():
    """torch.func.functional_call with buffers that vmap wraps: the op, not the C call."""
    layer = make_awq(dtype=torch.float32)
    x = torch.randn(3, 256)
    stacked = torch.stack([layer.scales, 2 * layer.scales])
    got = torch.func.vmap(
        lambda s: torch.func.functional_call(layer, {"scales": s}, (x,)))(stacked)
    double = AWQLinear.from_tensors(layer.qweight, layer.qzeros, 2 * layer.scales, layer.bias)
    with torch.no_grad():
        assert torch.equal(got[0], layer(x)) and torch.equal(got[1], double(x))


def test_awq_linear_dequantized_weight_has_gradients_and_a_meta_shape():
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    layer = make_awq(dtype=torch.float32)
    layer.scales.requires_grad_()
    w = layer.dequantized_weight()
    assert w.requires_grad
    weights = torch.linspace(-1, 1, w.numel()).reshape(w.shape)
    (w * weights).sum().backward()
    scales = layer.scales.detach().clone().requires_grad_()
    (dense_weight(layer.qweight, layer.qzeros, scales).t() * weights).sum().backward()
    torch.testing.assert_close(layer.scales.grad, scales.grad, rtol=1e-5, atol=1e-5)

    meta = AWQLinear(256, 64, 128, dtype=torch.bfloat16, device="meta")
    w = meta.dequantized_weight(torch.float32)
    assert w.is_meta and w.shape == (64, 256) and w.dtype == torch.float32
    with FakeTensorMode():
        w = make_awq(dtype=torch.float32).dequantized_weight()
    assert isinstance(w, FakeTensor) and w.shape == (64, 256)


def test_awq_linear_dequantized_weight_is_the_nn_linear_weight():
    qweight, qzeros, scales, b = layer_tensors(256, 64, 128, torch.bfloat16)
    layer = AWQLinear.from_tensors(qweight, qzeros, scales, b)
    w = layer.dequantized_weight()
    assert w.shape == (64, 256) and w.is_contiguous() and w.dtype == torch.bfloat16
    assert torch.equal(w, reference_weight(qweight, qzeros, scales).t())
    assert layer.dequantized_weight(torch.float32).dtype == torch.float32


def test_awq_linear_state_dict_round_trip():
    layer = make_awq(dtype=torch.bfloat16, seed=3)
    buffer = io.BytesIO()
    torch.save(layer.state_dict(), buffer)
    buffer.seek(0)
    fresh = AWQLinear(256, 64, 128, bias=True, dtype=torch.bfloat16)
    fresh.load_state_dict(torch.load(buffer))
    for name, t in layer.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], t), name
    x = torch.randn(3, 256).to(torch.bfloat16)
    assert torch.equal(fresh(x), layer(x))


def test_awq_linear_load_state_dict_refuses_packed_words_of_another_dtype():
    """copy_ would convert the values: float or int64 words would load as other words."""
    source = make_awq(dtype=torch.float32, seed=3).state_dict()
    for name, dtype in (("qweight", torch.float32), ("qzeros", torch.int64),
                        ("qweight", torch.float16)):
        layer = make_awq(dtype=torch.float32)
        before = {k: v.clone() for k, v in layer.state_dict().items()}
        bad = dict(source, **{name: source[name].to(dtype)})
        with pytest.raises(RuntimeError, match=rf"{name} must be int32 .*holds {dtype}"):
            layer.load_state_dict(bad)
        assert all(torch.equal(v, before[k]) for k, v in layer.state_dict().items())
    # uint32 words are the same bits: they load, and the caller's mapping keeps its tensors
    layer = make_awq(dtype=torch.float32)
    unsigned = dict(source, qweight=source["qweight"].view(torch.uint32),
                    qzeros=source["qzeros"].view(torch.uint32))
    layer.load_state_dict(unsigned)
    assert unsigned["qweight"].dtype == unsigned["qzeros"].dtype == torch.uint32
    for name, t in source.items():
        assert torch.equal(layer.state_dict()[name], t), name
    nested = nn.Sequential(make_awq(dtype=torch.float32))
    with pytest.raises(RuntimeError, match=r"0\.qweight must be int32"):
        nested.load_state_dict({f"0.{k}": v.float() if k == "qweight" else v
                                for k, v in source.items()})


def test_awq_linear_dtype_conversion_keeps_the_packed_words():
    layer = make_awq(dtype=torch.float16).to(torch.float32)
    assert layer.scales.dtype == layer.bias.dtype == torch.float32
    assert layer.qweight.dtype == layer.qzeros.dtype == torch.int32


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize("G", [64, 128, -1])
def test_from_linear_is_within_half_a_step_of_the_weights(dtype, G):
    torch.manual_seed(1)
    linear = nn.Linear(256, 72).to(dtype)
    layer = AWQLinear.from_linear(linear, group_size=G)
    Gr = 256 if G == -1 else G
    assert layer.group_size == Gr and layer.scales.dtype == dtype
    w = linear.weight.detach().float().t()  # [K, N]
    deq = layer.dequantized_weight(torch.float32).t()  # exact (q - z) * s
    step = layer.scales.float().repeat_interleave(Gr, dim=0)
    err = (deq - w).abs()
    # half a step, up to the float32 rounding of w / step
    assert torch.all(err <= step / 2 * (1 + 2**-20) + 2**-24 * w.abs())
    assert err.max() > 0.3 * step.max() / 2  # the bound is reached in practice, not trivially
    assert torch.equal(layer.bias, linear.bias.detach())


def test_from_linear_rejects_layers_that_do_not_fit():
    with pytest.raises(ValueError, match="out_features must be a multiple of 8; got 30"):
        AWQLinear.from_linear(nn.Linear(128, 30))
    with pytest.raises(ValueError, match="in_features.*multiple of group_size"):
        AWQLinear.from_linear(nn.Linear(100, 64), group_size=128)
    with pytest.raises(TypeError, match="nn.Linear"):
        AWQLinear.from_linear(nn.Conv1d(4, 8, 1))
    with pytest.raises(ValueError, match="meta"):
        AWQLinear.from_linear(nn.Linear(128, 64, device="meta"))


def test_from_tensors_rejects_bad_tensors_and_leaves_them_untouched():
    qweight, qzeros, scales, bias = layer_tensors(256, 64, 128)
    copies = [t.clone() for t in (qweight, qzeros, scales, bias)]
    cases = [
        ((qweight.float(), qzeros, scales), TypeError, "qweight must be int32"),
        ((qweight, qzeros.long(), scales), TypeError, "qzeros must be int32"),
        ((qweight, qzeros, scales.double()), TypeError, "scales.dtype must be"),
        ((qweight[0], qzeros, scales), ValueError, "qweight must be 2-D"),
        ((qweight, qzeros, scales[:, :8]), ValueError, r"scales must have shape \[K/G, N\]"),
        ((qweight, qzeros[:, :4], scales), ValueError, r"qzeros must have shape"),
        ((qweight[:99], qzeros, scales), ValueError, "dividing in_features=99"),
        ((qweight, qzeros, scales, bias[:8]), ValueError, r"bias must have shape \[64\]"),
        ((qweight, qzeros, scales, bias.float()), TypeError, "bias must have the dtype"),
        ((qweight, qzeros, scales.numpy()), TypeError, "scales must be a torch.Tensor"),
        ((qweight, qzeros, scales.to("meta")), ValueError, "one device"),
        ((qweight, None, scales), TypeError, "qzeros must be a torch.Tensor; got NoneType"),
        ((qweight, qzeros, scales, [0.0] * 64), TypeError, "bias must be a torch.Tensor or None"),
        # held as they are: the eager forward reads C-contiguous memory only
        ((qweight.t().contiguous().t(), qzeros, scales), ValueError,
         r"qweight must be contiguous .*pass qweight.contiguous\(\)"),
        ((qweight, qzeros, scales.t().contiguous().t()), ValueError, "scales must be contiguous"),
        ((qweight, qzeros, scales, torch.cat([bias, bias])[::2]), ValueError,
         "bias must be contiguous"),
    ]
    for args, exc, message in cases:
        with pytest.raises(exc, match=message):
            AWQLinear.from_tensors(*args)
    for t, c in zip((qweight, qzeros, scales, bias), copies):
        assert torch.equal(t, c)


def test_from_tensors_holds_uint32_words_as_int32_views():
    qweight, qzeros, scales, bias = layer_tensors(256, 64, 128)
    words = qweight.view(torch.uint32), qzeros.view(torch.uint32)
    layer = AWQLinear.from_tensors(*words, scales, bias)
    assert layer.qweight.dtype == layer.qzeros.dtype == torch.int32
    assert layer.qweight.data_ptr() == qweight.data_ptr()
    assert layer.qzeros.data_ptr() == qzeros.data_ptr()
    x = torch.randn(3, 256, dtype=torch.float16)
    assert torch.equal(layer(x), AWQLinear.from_tensors(qweight, qzeros, scales, bias)(x))


def test_awq_linear_constructor_errors():
    with pytest.raises(ValueError, match="out_features must be a multiple of 8"):
        AWQLinear(256, 60)
    with pytest.raises(ValueError, match="in_features must be a multiple of group_size"):
        AWQLinear(200, 64, 128)
    with pytest.raises(ValueError, match="group_size must be positive"):
        AWQLinear(256, 64, 0)
    with pytest.raises(TypeError, match="dtype must be"):
        AWQLinear(256, 64, dtype=torch.float64)
    with pytest.raises(TypeError, match="in_features must be an integer"):
        AWQLinear(256.0, 64)


def test_awq_linear_rejects_x_of_another_dtype():
    layer = make_awq(dtype=torch.float16)
    with pytest.raises(TypeError):
        layer(torch.randn(2, 256))


def test_awq_linear_converted_to_float64_says_which_conversion():
    model = nn.Sequential(make_awq(dtype=torch.float32)).double()
    layer = model[0]
    words = [t.clone() for t in (layer.qweight, layer.qzeros)]
    message = r"scales are torch.float64.*model.double\(\).*convert the model back"
    x = torch.randn(2, 256, dtype=torch.float64)
    for call in (lambda: model(x), lambda: model(x.float()),
                 lambda: model(x.requires_grad_()), layer.dequantized_weight):
        with pytest.raises(TypeError, match=message):
            call()
    model.float()  # back, with the packed words as they were
    assert torch.equal(layer.qweight, words[0]) and torch.equal(layer.qzeros, words[1])
    assert_linear_close(model(x.detach().float()), x.detach().float(), layer.qweight,
                        layer.qzeros, layer.scales, layer.bias)


def test_awq_linear_type_conversion_keeps_the_packed_words():
    layer = make_awq(dtype=torch.float32)
    words = [t.clone() for t in (layer.qweight, layer.qzeros)]
    model = nn.Sequential(layer).type(torch.float16)  # every tensor, integers included
    assert layer.qweight.dtype == layer.qzeros.dtype == torch.int32
    assert torch.equal(layer.qweight, words[0]) and torch.equal(layer.qzeros, words[1])
    assert layer.scales.dtype == layer.bias.dtype == torch.float16
    x = torch.randn(2, 256, dtype=torch.float16)
    assert_linear_close(model(x), x, layer.qweight, layer.qzeros, layer.scales, layer.bias)


def test_jit_trace_records_the_op_not_a_constant():
    layer = make_awq(dtype=torch.float32)
    traced = torch.jit.trace(layer, torch.randn(2, 256))
    assert "awq_fast_dequant::linear" in str(traced.graph)
    x = torch.randn(2, 256)  # not the traced input
    with torch.no_grad():
        assert torch.equal(traced(x), layer(x))


# --- the module call -----------------------------------------------------------

def python_frames(fn):
    """The names of the Python functions that fn() enters, in order."""
    names = []

    def profile(frame, event, arg):
        if event == "call":
            names.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return names


def test_awq_linear_call_skips_nn_module_only_while_nothing_needs_it():
    layer, x = make_awq(dtype=torch.float32), torch.randn(2, 256)
    with torch.no_grad():
        frames = python_frames(lambda: layer(x))  # linear() from C (csrc/module_call.c)
        assert "forward" not in frames and "_call_impl" not in frames
        handle = layer.register_forward_hook(lambda module, args, out: None)
        assert "_call_impl" in python_frames(lambda: layer(x))
        handle.remove()
        assert python_frames(lambda: layer(x)) == frames


class _PlusOne(AWQLinear):
    def forward(self, x):
        return super().forward(x) + 1


def _declined_call(case, layer, x):
    """A call of layer on x that the C call must leave to Python, and its result
    computed another way."""
    if case == "x not contiguous":
        xt = x.t().contiguous().t()
        return lambda: layer(xt), layer.forward(x)
    if case == "x by keyword":
        return lambda: layer(x=x), layer.forward(x)
    if case == "x a subclass":
        sub = x.as_subclass(nn.Parameter)
        return lambda: layer(sub), layer.forward(x)
    if case == "forward of a subclass":
        plus = _PlusOne.from_tensors(layer.qweight, layer.qzeros, layer.scales, layer.bias)
        return lambda: plus(x), layer.forward(x) + 1
    if case == "forward on the instance":
        other = make_awq(dtype=torch.float32)
        other.forward = lambda t: layer.forward(t) * 2
        return lambda: other(x), layer.forward(x) * 2
    if case == "scales a parameter":
        other = make_awq(dtype=torch.float32)
        other.scales = nn.Parameter(other.scales.clone(), requires_grad=False)
        return lambda: other(x), layer.forward(x)
    if case == "a dispatch mode":
        from torch.utils._python_dispatch import TorchDispatchMode

        class Count(TorchDispatchMode):
            ops = []

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                self.ops.append(str(func))
                return func(*args, **(kwargs or {}))

        def under_mode():
            with Count():
                y = layer(x)
            assert any("awq_fast_dequant" in op for op in Count.ops)
            return y
        return under_mode, layer.forward(x)
    if case == "a forward-mode AD level":
        import torch.autograd.forward_ad as fwAD

        def dual():
            with fwAD.dual_level():
                return fwAD.unpack_dual(layer(fwAD.make_dual(x, torch.ones_like(x)))).primal
        return dual, layer.forward(x)
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["x not contiguous", "x by keyword", "x a subclass",
                                  "forward of a subclass", "forward on the instance",
                                  "scales a parameter", "a dispatch mode",
                                  "a forward-mode AD level"])
def test_awq_linear_c_call_leaves_to_python_what_needs_it(case):
    layer, x = make_awq(dtype=torch.float32), torch.randn(2, 256)
    with torch.no_grad():
        call, want = _declined_call(case, layer, x)
        frames = python_frames(lambda: torch.testing.assert_close(call(), want, rtol=0, atol=0))
    assert "forward" in frames


def test_awq_linear_c_call_leaves_to_python_what_autograd_records():
    layer = make_awq(dtype=torch.float32)
    x = torch.randn(2, 256, requires_grad=True)
    frames = python_frames(lambda: layer(x).sum().backward())
    assert "forward" in frames and x.grad is not None
    from awq_fast_dequant.torch import _ops
    with torch.no_grad():  # nothing to record: linear() from C, but where torch's
        frames = python_frames(lambda: layer(x))  # DLPack refuses x (forward detaches it)
    assert ("forward" in frames) == _ops.OLD_DLPACK


def _hooked(kind, layer, calls):
    """Registers a hook of this kind on layer (or for every module) that records
    its call in calls, and changes x or y where it may; returns its handle and
    what the hooked call gives, from forward and x."""
    module = nn.modules.module
    unchanged = lambda forward, x: forward(x)
    if kind == "forward_pre":
        return (layer.register_forward_pre_hook(
            lambda m, args: calls.append(kind) or (args[0] * 2,)),
            lambda forward, x: forward(x * 2))
    if kind == "forward_pre_with_kwargs":
        return (layer.register_forward_pre_hook(
            lambda m, args, kwargs: calls.append(kind) or ((args[0] * 2,), kwargs),
            with_kwargs=True), lambda forward, x: forward(x * 2))
    if kind == "forward":
        return (layer.register_forward_hook(
            lambda m, args, out: calls.append(kind) or out + 1),
            lambda forward, x: forward(x) + 1)
    if kind == "global_forward_pre":
        return (module.register_module_forward_pre_hook(
            lambda m, args: calls.append(kind) if m is layer else None), unchanged)
    if kind == "global_forward":
        return (module.register_module_forward_hook(
            lambda m, args, out: (calls.append(kind) or out - 1) if m is layer else None),
            lambda forward, x: forward(x) - 1)
    if kind == "full_backward":
        return (layer.register_full_backward_hook(
            lambda m, grad_in, grad_out: calls.append(kind)), unchanged)
    if kind == "backward_pre":
        return (layer.register_full_backward_pre_hook(
            lambda m, grad_out: calls.append(kind)), unchanged)
    assert kind == "global_backward"
    return (module.register_module_full_backward_hook(
        lambda m, grad_in, grad_out: calls.append(kind) if m is layer else None), unchanged)


@pytest.mark.parametrize("kind", ["forward_pre", "forward_pre_with_kwargs", "forward",
                                  "global_forward_pre", "global_forward", "full_backward",
                                  "backward_pre", "global_backward"])
def test_awq_linear_hooks_run_as_on_any_module(kind):
    layer = make_awq(dtype=torch.float32)
    x = torch.randn(2, 256, requires_grad=True)
    calls = []
    handle, hooked = _hooked(kind, layer, calls)
    try:
        y = layer(x)
        y.sum().backward()
    finally:
        handle.remove()
    assert calls == [kind]
    assert torch.equal(y, hooked(layer.forward, x)) and x.grad is not None


def test_awq_linear_call_honours_a_forward_set_on_the_instance():
    # accelerate's hooks, for one, put a wrapper of forward on the instance
    layer, x = make_awq(dtype=torch.float32), torch.randn(2, 256)
    original = layer.forward
    layer.forward = lambda t: original(t) * 3
    assert torch.equal(layer(x), original(x) * 3)


def test_awq_linear_call_takes_a_compiled_call_and_patched_module_calls(monkeypatch):
    layer, x = make_awq(dtype=torch.float32), torch.randn(2, 256)
    layer._compiled_call_impl = lambda *args, **kwargs: "compiled"  # what Module.compile sets
    assert layer(x) == "compiled"
    layer._compiled_call_impl = None
    for name in ("__call__", "_call_impl"):  # torch.fx's tracer patches __call__
        seen = []
        unpatched = getattr(nn.Module, name)
        monkeypatch.setattr(
            nn.Module, name,
            lambda self, *a, f=unpatched, **k: seen.append(self) or f(self, *a, **k))
        assert torch.equal(layer(x), layer.forward(x)) and layer in seen
        monkeypatch.undo()


def test_awq_linear_module_compile_and_fx_trace():
    layer, x = make_awq(dtype=torch.float32), torch.randn(2, 256)
    with torch.no_grad():
        want = layer.forward(x)
        traced = torch.fx.symbolic_trace(nn.Sequential(layer, nn.ReLU()))
        assert "awq_fast_dequant.linear" in traced.code
        assert torch.equal(traced(x), torch.relu(want))
        layer.compile(fullgraph=True)
        assert layer._compiled_call_impl is not None
        assert torch.equal(layer(x), want)


def test_awq_linear_keeps_nn_module_call_where_torch_keeps_its_hooks_elsewhere():
    code = ("import torch\n"
            "del torch.nn.modules.module._global_forward_hooks\n"
            "from awq_fast_dequant.torch import AWQLinear\n"
            "print(AWQLinear.__call__ is torch.nn.Module.__call__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=child_env(), cwd="/", check=True)
    assert out.stdout.strip() == "True"


# --- quantize_model -----------------------------------------------------------

class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 256)
        self.up = nn.Linear(256, 512)
        self.down = nn.Linear(512, 256, bias=False)
        self.odd_in = nn.Linear(100, 64)
        self.odd_out = nn.Linear(256, 30)
        self.attn = nn.MultiheadAttention(256, 4, batch_first=True)  # out_proj: a Linear subclass
        self.proj = nn.Linear(256, 256)
        self.lm_head = nn.Linear(256, 50, bias=False)
        self.lm_head.weight = self.embed.weight  # tied

    def forward(self, ids):
        h = self.embed(ids)
        h = h + self.down(torch.relu(self.up(h)))
        h = h + self.attn(h, h, h, need_weights=False)[0]
        return self.lm_head(self.proj(h))


def test_quantize_model_replaces_what_fits_and_reports_the_rest(caplog):
    torch.manual_seed(0)
    model = Toy()
    with caplog.at_level(logging.INFO, logger="awq_fast_dequant"):
        skipped = dict(quantize_model(model, 128, skip=("lm_head",)))
    assert {type(m).__name__ for m in (model.up, model.down, model.proj)} == {"AWQLinear"}
    assert type(model.odd_in) is nn.Linear and type(model.odd_out) is nn.Linear
    assert skipped == {
        "odd_in": "in_features 100 is not a multiple of group_size 128",
        "odd_out": "out_features 30 is not a multiple of 8",
        "attn.out_proj": ("NonDynamicallyQuantizableLinear is a subclass of nn.Linear whose "
                          "forward may not be nn.Linear's"),
        "lm_head": "matches skip pattern 'lm_head'",
    }
    assert "odd_out left dense: out_features 30" in caplog.text
    assert "3 nn.Linear layers quantized" in caplog.text
    ids = torch.randint(0, 50, (2, 9))
    with torch.no_grad():
        assert model(ids).shape == (2, 9, 50)


def test_quantize_model_output_is_the_dequantized_models():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.SiLU(), nn.Linear(256, 128))
    quantize_model(model, 64)
    dense = nn.Sequential(nn.Linear(256, 256), nn.SiLU(), nn.Linear(256, 128))
    for i in (0, 2):
        dense[i].weight.data = model[i].dequantized_weight()
        dense[i].bias.data = model[i].bias.clone()
    x = torch.randn(4, 256)
    with torch.no_grad():
        torch.testing.assert_close(model(x), dense(x), rtol=1e-5, atol=1e-5)


def test_quantize_model_skip_patterns_and_ties():
    torch.manual_seed(0)
    model = Toy()
    model.lm_head.weight = nn.Parameter(torch.randn(56, 256))  # untied, N % 8 == 0
    model.lm_head.out_features = 56
    skipped = dict(quantize_model(model, 128, skip=[re.compile(r"^(up|proj)$")]))
    assert set(skipped) == {"up", "proj", "odd_in", "odd_out", "attn.out_proj"}
    assert skipped["up"] == "matches skip pattern '^(up|proj)$'"
    assert type(model.lm_head).__name__ == "AWQLinear"

    tied = Toy()
    skipped = dict(quantize_model(tied, 128, skip=None))
    assert skipped["lm_head"] == ("its weight is tied to embed.weight; quantizing it would "
                                  "untie them")


def test_quantize_model_shared_module_becomes_one_awq_linear():
    shared = nn.Linear(128, 64)
    model = nn.ModuleDict({"a": shared, "b": nn.Sequential(shared)}).eval()
    assert quantize_model(model, 128) == []
    assert model["a"] is model["b"][0] and isinstance(model["a"], AWQLinear)
    assert not model["a"].training  # the mode of the layer it replaces


def test_quantize_model_sets_a_hugging_face_style_config():
    class WithConfig(nn.Module):
        def __init__(self):
            super().__init__()
            self.config = type("Config", (), {"to_dict": lambda self: {}})()
            self.q = nn.Linear(256, 64)
            self.lm_head = nn.Linear(256, 50)

    model = WithConfig()
    quantize_model(model, 64)
    assert model.config.quantization_config == {
        "quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": True,
        "version": "gemm", "modules_to_not_convert": ["lm_head"]}


def test_quantize_model_errors():
    with pytest.raises(TypeError, match="use AWQLinear.from_linear"):
        quantize_model(nn.Linear(128, 64))
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        quantize_model({"a": nn.Linear(128, 64)})
    with pytest.raises(TypeError, match="skip must hold strings"):
        quantize_model(nn.Sequential(nn.Linear(128, 64)), skip=[3])
    with pytest.raises(ValueError, match="group_size must be positive"):
        quantize_model(nn.Sequential(nn.Linear(128, 64)), group_size=0)
    for size in (True, -1.0, 64.0):
        model = nn.Sequential(nn.Linear(128, 64))
        with pytest.raises(TypeError, match=f"group_size must be an integer; got {size!r}"):
            quantize_model(model, group_size=size)
        assert type(model[0]) is nn.Linear
    with pytest.raises(ValueError, match="act_order=True needs calibration"):
        quantize_model(nn.Sequential(nn.Linear(128, 64)), act_order=True)
    with pytest.raises(TypeError, match="act_order must be True, False or None"):
        quantize_model(nn.Sequential(nn.Linear(128, 64)), act_order="yes")
    model = nn.Sequential(nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 64)).double()
    weights = [p.clone() for p in model.parameters()]
    with pytest.raises(TypeError, match=r"^0 has a torch.float64 weight.*model.float\(\)"):
        quantize_model(model, group_size=64)
    assert [type(m) for m in model] == [nn.Linear, nn.ReLU, nn.Linear]
    assert all(torch.equal(p, w) for p, w in zip(model.parameters(), weights))
    # a float64 layer left dense by skip is no obstacle
    model = nn.Sequential(nn.Linear(128, 64), nn.Linear(64, 64).double())
    assert quantize_model(model, 64, skip="1") == [("1", "matches skip pattern '1'")]
    assert isinstance(model[0], AWQLinear) and type(model[1]) is nn.Linear


def test_quantize_model_skips_a_shared_module_if_any_of_its_names_matches():
    for skip in ("enc", "dec"):
        shared = nn.Linear(128, 64)
        model = nn.Module()
        model.enc, model.dec = nn.Sequential(shared), nn.Sequential(shared)
        assert quantize_model(model, 64, skip=skip) == [
            (f"{skip}.0", f"matches skip pattern {skip!r}")]
        assert model.enc[0] is shared and model.dec[0] is shared


def test_quantize_model_refuses_skip_of_another_type():
    model = nn.Sequential(nn.Linear(128, 64))
    for skip, got in ((lambda name: True, "function"), (3, "int"), (b"lm_head", "bytes")):
        with pytest.raises(TypeError, match=f"skip must be a string, a compiled regular "
                                            f"expression or an iterable of them.*got {got}$"):
            quantize_model(model, 64, skip=skip)
    assert type(model[0]) is nn.Linear


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")
def test_quantize_model_leaves_empty_layers_dense():
    model = nn.Sequential(nn.Linear(128, 0), nn.Linear(0, 64), nn.Linear(128, 64))
    assert quantize_model(model, -1) == [
        ("0", "it has no weights (in_features 128, out_features 0)"),
        ("1", "it has no weights (in_features 0, out_features 64)")]
    assert type(model[0]) is nn.Linear and type(model[1]) is nn.Linear
    assert isinstance(model[2], AWQLinear)


class TwoParts(nn.Module):
    """A Hugging Face-style model (config.to_dict) quantized in parts."""
    def __init__(self):
        super().__init__()
        self.config = type("Config", (), {"to_dict": lambda self: {}})()
        self.first = nn.Linear(128, 64)
        self.second = nn.Linear(128, 64)
        self.lm_head = nn.Linear(128, 64)


def test_quantize_model_in_parts_describes_the_whole_model():
    """A second call keeps the first call's layers out of modules_to_not_convert, which
    lists only what is still dense, and refuses another group size before any change."""
    torch.manual_seed(0)
    model = TwoParts()
    quantize_model(model, 64, skip=["second", "lm_head"])
    assert model.config.quantization_config["modules_to_not_convert"] == ["second", "lm_head"]
    quantize_model(model, 64, skip=["first", "lm_head"])
    assert isinstance(model.first, AWQLinear) and isinstance(model.second, AWQLinear)
    config = dict(model.config.quantization_config)
    assert config == {"quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": True,
                      "version": "gemm", "modules_to_not_convert": ["lm_head"]}

    with pytest.raises(ValueError, match="group_size 128 differs from 64, .*pass group_size=64"):
        quantize_model(model, 128, skip=())
    assert type(model.lm_head) is nn.Linear and model.config.quantization_config == config
    assert quantize_model(model, 64, skip=()) == []
    assert model.config.quantization_config["modules_to_not_convert"] is None


class TwoInputs(nn.Module):
    """up(a) + side(b), then down: calibration items reach forward(a, b)."""
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(64, 96)
        self.side = nn.Linear(32, 96, bias=False)
        self.down = nn.Linear(96, 16)
        self.unused = nn.Linear(64, 8)
        self.drop = nn.Dropout(0.5)

    def forward(self, a, b=None):
        h = self.up(a) if b is None else self.up(a) + self.side(b)
        return self.down(torch.relu(self.drop(h)))


def hessian_of(inputs):
    """X^T X accumulated as quantize_model does: float32, x^T x of one input after
    another, added up."""
    total = None
    for x in inputs:
        x = x.reshape(-1, x.shape[-1]).float()
        total = x.T @ x if total is None else total.add_(x.T @ x)
    return total


def test_quantize_model_calibration_is_gptq_of_each_layers_dense_inputs(caplog):
    torch.manual_seed(0)
    model = TwoInputs()
    dense = TwoInputs()
    dense.load_state_dict(model.state_dict())
    a = [torch.randn(2, 5, 64), torch.randn(7, 64), torch.randn(3, 64)]
    b = [torch.randn(2, 5, 32), torch.randn(7, 32), None]
    calibration = [{"a": a[0], "b": b[0]}, (a[1], b[1]), a[2]]  # mapping, tuple, tensor
    model.train()
    with caplog.at_level(logging.INFO, logger="awq_fast_dequant"):
        assert quantize_model(model, 32, calibration=calibration) == []
    dense.eval()  # calibration runs in eval mode: no dropout
    with torch.no_grad():
        h = [dense.up(x) if y is None else dense.up(x) + dense.side(y) for x, y in zip(a, b)]
    expected = {
        "up": hessian_of(a), "side": hessian_of(b[:2]),
        "down": hessian_of([torch.relu(x) for x in h]),  # the unquantized model's activations
        "unused": None,  # never called: min-max
    }
    for name, hessian in expected.items():
        layer, linear = getattr(model, name), getattr(dense, name)
        want = AWQLinear.from_linear(linear, 32, hessian=hessian)
        for buffer in ("qweight", "qzeros", "scales"):
            assert torch.equal(getattr(layer, buffer), getattr(want, buffer)), (name, buffer)
    plain = AWQLinear.from_linear(dense.up, 32)
    assert not torch.equal(model.up.qweight, plain.qweight)  # the statistics were used
    assert "unused received no calibration input" in caplog.text
    assert "3 calibration inputs, 3 layers calibrated" in caplog.text
    # each module's mode is back, and no hook is left behind
    assert all(m.training for m in model.modules())
    assert all(not m._forward_pre_hooks for m in dense.modules())
    assert all(not m._forward_pre_hooks for m in model.modules())


class SharedInputs(nn.Module):
    """q, k and v of one tensor, as in attention, then o; gate and up of one tensor, as
    in a gated FFN; except where the item says otherwise: "split" gives up another
    tensor, "in place" changes gate's input in place before up reads it, "twice"
    runs o twice on the same tensor, "no v" leaves v out."""
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(64, 32) for _ in range(3))
        self.o = nn.Linear(32, 64)
        self.gate, self.up = nn.Linear(64, 96), nn.Linear(64, 96)

    def forward(self, x, how=""):
        h = self.q(x) * self.k(x)
        if how != "no v":
            h = h + self.v(x)
        y = self.o(h) + self.o(h) if how == "twice" else self.o(h)
        g = self.gate(y)
        if how == "in place":
            y.mul_(2)
        return g * self.up(y * 3 if how == "split" else y)


def test_quantize_model_layers_with_one_input_share_its_statistics():
    from awq_fast_dequant.torch import _module

    torch.manual_seed(0)
    model = SharedInputs()
    layers = dict(model.named_children())
    items = [(torch.randn(5, 64), how) for how in ("", "split", "twice", "in place", "no v", "")]

    def statistics(items):
        stats, count = _module._input_statistics(
            model, {id(m): m for m in layers.values()}, items,
            _module._Progress(False, "calibration", None, "input"))
        assert count == len(items)
        return {name: stats[id(m)] for name, m in layers.items()}

    inputs = {name: [] for name in layers}
    hooks = [m.register_forward_pre_hook(lambda m, args, name=name: inputs[name].append(
        args[0].clone())) for name, m in layers.items()]
    with torch.no_grad():
        for item in items:
            model(*item)
    for hook in hooks:
        hook.remove()
    assert len(inputs["o"]) == 7 and len(inputs["v"]) == 5

    got = statistics(items[:1])
    assert got["q"] is got["k"] is got["v"] and got["gate"] is got["up"]
    assert len({id(matrix) for matrix in got.values()}) == 3
    assert torch.equal(got["q"], hessian_of(inputs["q"][:1]))
    # An item that gives the layers of a group different tensors (up another one, or
    # gate's changed in place, or v none) parts the group for the rest of the pass.
    got = statistics(items)
    for name, matrix in got.items():  # the sums of each layer's own inputs, bit for bit
        assert torch.equal(matrix, hessian_of(inputs[name])), name
    assert got["q"] is got["k"]
    assert len({id(matrix) for matrix in got.values()}) == 5


def test_quantize_model_progress_lines_without_tqdm(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm raises ImportError
    torch.manual_seed(0)
    model = TwoInputs()
    calibration = [torch.randn(3, 64), torch.randn(5, 64)]
    assert quantize_model(model, 32, calibration=calibration, progress=True) == []
    lines = capsys.readouterr().err.splitlines()
    assert lines[:2] == ["quantize_model calibration [1/2]", "quantize_model calibration [2/2]"]
    rounded = [re.fullmatch(r"quantize_model quantize \[(\d)/4\] (\w+) (\d+)x(\d+) [\d.]+ s", line)
               for line in lines[2:]]
    assert all(rounded) and len(rounded) == 4, lines
    assert [m.group(1, 2, 3, 4) for m in rounded] == [
        ("1", "up", "64", "96"), ("2", "side", "32", "96"), ("3", "down", "96", "16"),
        ("4", "unused", "64", "8")]


def test_quantize_model_progress_bar_and_silence(capsys):
    pytest.importorskip("tqdm", reason="needs tqdm")
    torch.manual_seed(0)
    quantize_model(TwoInputs(), 32, calibration=iter([torch.randn(3, 64)]), progress=True)
    err = capsys.readouterr().err
    assert "quantize_model calibration" in err and "1input" in err.replace(" ", "")
    assert "quantize_model quantize" in err and "4/4" in err
    quantize_model(TwoInputs(), 32, calibration=[torch.randn(3, 64)])
    assert capsys.readouterr().err == ""


def test_quantize_model_calibration_errors_leave_the_model_untouched():
    def fresh():
        torch.manual_seed(0)
        return TwoInputs().train()

    for calibration, error, message in (
            (5, TypeError, "calibration must be an iterable of model inputs .*got int"),
            ("some text", TypeError, "not a str: tokenize the text first"),
            (b"some text", TypeError, "not a bytes: tokenize the text first"),
            (torch.randn(4, 64), TypeError, "got a single Tensor: wrap it in a list"),
            ({"a": torch.randn(4, 64)}, TypeError, "got a single dict: wrap it in a list"),
            ([], ValueError, "calibration must yield at least one model input"),
            ([torch.randn(4, 64), torch.randn(4, 63)], RuntimeError, "shapes cannot be"),
            ([torch.full((4, 64), float("inf"))], ValueError,
             "^up cannot be quantized: hessian must be finite"),
    ):
        model = fresh()
        before = {k: v.clone() for k, v in model.state_dict().items()}
        with pytest.raises(error, match=message):
            quantize_model(model, 32, calibration=calibration)
        assert all(type(m) is nn.Linear for m in (model.up, model.side, model.down))
        assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
        assert all(m.training for m in model.modules())
        assert all(not m._forward_pre_hooks for m in model.modules())


# --- CUDA ---------------------------------------------------------------------

@cuda
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=str)
def test_awq_linear_cuda(dtype):
    layer = make_awq(512, 1024, 128, dtype, "cuda")
    for rows in (1, 7, 64):
        x = torch.randn(rows, 512, device="cuda").to(dtype)
        assert_linear_close(layer(x), x, layer.qweight, layer.qzeros, layer.scales, layer.bias)


@cuda
def test_awq_linear_cuda_graph_capture_and_replay():
    layer = make_awq(512, 256, 128, torch.float16, "cuda")
    static_x = torch.randn(4, 512, device="cuda", dtype=torch.float16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():  # warm-up outside capture
        for _ in range(3):
            layer(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        static_y = layer(static_x)
    for seed in range(3):
        x = torch.randn(4, 512, device="cuda", dtype=torch.float16,
                        generator=torch.Generator("cuda").manual_seed(seed))
        static_x.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        assert_linear_close(static_y, x, layer.qweight, layer.qzeros, layer.scales, layer.bias)


@cuda
def test_compile_on_cuda_with_cuda_graphs():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 256), nn.GELU(), nn.Linear(256, 128)).cuda().half()
    quantize_model(model, 128)
    x = torch.randn(3, 512, device="cuda", dtype=torch.float16)
    for mode in (None, "reduce-overhead"):
        compiled = torch.compile(model, fullgraph=True, mode=mode)
        with torch.no_grad():
            for _ in range(3):  # reduce-overhead records the graph on a later call
                got = compiled(x)
            torch.testing.assert_close(got, model(x), rtol=2e-3, atol=2e-3)


@cuda
@pytest.mark.skipif(HAS_CUDA and torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_awq_linear_on_the_second_gpu():
    layer = make_awq(512, 256, 128, torch.bfloat16, "cuda:1")
    x = torch.randn(5, 512, device="cuda:1").to(torch.bfloat16)
    y = layer(x)
    assert y.device == torch.device("cuda:1")
    assert_linear_close(y, x, layer.qweight, layer.qzeros, layer.scales, layer.bias)
    compiled = torch.compile(layer, fullgraph=True)
    with torch.no_grad():
        assert_linear_close(compiled(x), x, layer.qweight, layer.qzeros, layer.scales, layer.bias)
