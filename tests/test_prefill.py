"""prepare_prefill: the prefill kernel's weight layout and the layers that use it.

The layout is checked on the host against the packing's own definition
(awq_fast_dequant.quant.unpack and the documented placement of every nibble,
zero and scale); the kernel, on compute capability 9.0, against the float64
reference within linear()'s tolerance (DESIGN.md section 7), bit for bit
across runs, with every argument error it must refuse."""

import copy

import numpy as np
import pytest

import awq_fast_dequant as awq
from awq_fast_dequant.quant import unpack

from conftest import assert_linear_close, capture_cuda_graph

torch = pytest.importorskip("torch", reason="needs torch")
nn = torch.nn
from awq_fast_dequant.torch import AWQLinear, fuse_projections, prepare_prefill  # noqa: E402
from awq_fast_dequant.torch import _prefill  # noqa: E402

HOPPER = (awq.cuda_available() and torch.cuda.is_available()
          and awq._C._prepared_supported(torch.cuda.current_device()))
hopper = pytest.mark.skipif(not HOPPER, reason="needs compute capability 9.0 (H100, H200) and a "
                                               "build with its sm_90a code")


def random_layer(K, N, G, dtype, seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    word = lambda *s: torch.randint(-2**31, 2**31, s, generator=gen).to(torch.int32)  # noqa: E731
    qweight, qzeros = word(K, N // 8), word(K // G, N // 8)
    scales = (torch.rand(K // G, N, generator=gen) * 0.01 + 2.0**-10).to(dtype)
    return qweight.to(device), qzeros.to(device), scales.to(device)


def half_bits(values, dtype):
    return torch.tensor(values, dtype=torch.float32).to(dtype).view(torch.int16).numpy().astype(np.int64) & 0xFFFF


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("G", [64, 128])
def test_layout_places_every_nibble_zero_and_scale_where_the_kernel_reads_it(dtype, G):
    K, N = 256, 384
    qweight, qzeros, scales = random_layer(K, N, G, dtype)
    words, operands = _prefill.layout(qweight, qzeros, scales, G)
    assert words.dtype == operands.dtype == torch.int32
    assert words.shape == (N // 128, K // 64, 2, 4, 32, 4)
    assert operands.shape == (K // G, N // 128, 2, 4, 8, 4)
    codes = unpack(qweight.numpy()).astype(np.int64)  # [K, N]
    zeros = unpack(qzeros.numpy()).astype(np.int64)
    sbits = scales.view(torch.int16).numpy().astype(np.int64) & 0xFFFF
    w = words.numpy().astype(np.int64) & 0xFFFFFFFF
    o = operands.numpy().astype(np.int64) & 0xFFFFFFFF
    for t in range(N // 128):
        for h in range(2):
            for wp in range(4):
                for g in range(8):
                    c = 128 * t + 64 * h + 16 * wp + 2 * g
                    for s in range(K // 64):
                        for i in range(4):
                            for kk in range(4):
                                word = w[t, s, h, wp, 4 * g + i, kk]
                                k = 64 * s + 16 * kk + 2 * i
                                for lo in range(2):
                                    for hi in range(2):
                                        for cc in range(2):
                                            nib = (word >> (16 * lo + 8 * hi + 4 * cc)) & 15
                                            assert nib == codes[k + 8 * hi + lo, c + cc]
                    for q in range(K // G):
                        op = o[q, t, h, wp, g]
                        z0, z1 = zeros[q, c], zeros[q, c + 1]
                        if dtype == torch.float16:
                            want = [0x6400 + z0, int(half_bits([-(64 + z1)], dtype)[0])]
                        else:
                            want = [0x4300 + z0, 0x4300 + z1]
                        want += [sbits[q, c], sbits[q, c + 1]]
                        assert [int(v) for v in op] == [v | (v << 16) for v in want]


def test_layout_is_built_in_chunks_the_same_as_at_once(monkeypatch):
    qweight, qzeros, scales = random_layer(128, 512, 128, torch.float16, seed=3)
    whole = _prefill.layout(qweight, qzeros, scales, 128)
    monkeypatch.setattr(_prefill, "_CHUNK_BYTES", 1)  # one 128-column tile at a time
    parts = _prefill.layout(qweight, qzeros, scales, 128)
    assert all(torch.equal(a, b) for a, b in zip(whole, parts))


def test_prepare_prefill_reports_why_it_leaves_a_layer_alone():
    model = nn.Sequential(AWQLinear(256, 256, 128), nn.ReLU(), AWQLinear(256, 256, 128))
    report = prepare_prefill(model)
    assert report["prepared"] == [] and report["bytes"] == 0
    assert set(report["skipped"]) == {"0", "2"}
    assert "not a CUDA device" in report["skipped"]["0"]
    assert all(m._prefill is None for m in model.modules() if isinstance(m, AWQLinear))
    with pytest.raises(TypeError, match="nn.Module"):
        prepare_prefill(torch.zeros(3))
    for bad, exc in ((0, ValueError), (-1, ValueError), (1.5, TypeError), (True, TypeError)):
        with pytest.raises(exc, match="min_rows"):
            prepare_prefill(model, min_rows=bad)


def test_calls_below_min_rows_stay_on_the_c_call_path(monkeypatch):
    torch.manual_seed(0)
    layer = AWQLinear.from_linear(nn.Linear(256, 128), 128)
    pre = _prefill.Prepared.__new__(_prefill.Prepared)  # a layout's stand-in: forward passes host x on
    pre.min_rows, pre.dtype = 8, torch.float16
    layer._prefill = pre
    calls = []
    real = _prefill.forward
    monkeypatch.setattr(_prefill, "forward", lambda *a: calls.append(a[1].shape) or real(*a))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for shape in ((3, 256), (7, 256), (8, 256), (2, 3, 256), (2, 5, 256), (0, 256), (1, 1, 1, 256)):
            x = torch.randn(*shape, generator=gen)
            y = layer(x)
            assert_linear_close(y.reshape(-1, 128), x.reshape(-1, 256), layer.qweight, layer.qzeros,
                                layer.scales, layer.bias, 128)
    assert calls == [(8, 256), (2, 5, 256)]  # 8 and 10 rows: forward's; fewer: linear() from C


def test_a_conversion_keeps_the_layout_of_unchanged_buffers_and_rebuilds_a_stale_one():
    layer = AWQLinear.from_linear(nn.Linear(256, 128).half(), 128)
    pre = layer._prefill = _prefill.Prepared(layer, 8)  # built on the host: the layout is torch code
    layer.to(torch.float16)
    layer.cpu()
    assert layer._prefill is pre  # the same buffers: nothing built again
    with torch.no_grad():
        layer.scales.mul_(2)  # written in place: the layout is stale
    layer.to(torch.float16)
    assert layer._prefill is None  # built again from the buffers, which the kernel cannot run on the host


def test_the_kernel_entry_refuses_host_memory_with_a_clear_error():
    qweight, qzeros, scales = random_layer(128, 128, 64, torch.float16)
    words, operands = _prefill.layout(qweight, qzeros, scales, 64)
    x = torch.zeros(4, 128, dtype=torch.float16)
    with pytest.raises(ValueError, match="CUDA only"):
        awq._C._linear_prepared(x, words, operands, None, 64, None)
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        awq._C._linear_prepared(x.float(), words, operands, None, 64, None)
    with pytest.raises(TypeError, match="int32"):
        awq._C._linear_prepared(x, words.float(), operands, None, 64, None)


# ---- on compute capability 9.0 ----------------------------------------------

def prepared_call(x, qweight, qzeros, scales, G, bias=None, out=None):
    words, operands = _prefill.layout(qweight, qzeros, scales, G)
    return awq._C._linear_prepared(x, words, operands, bias, G, out)


# (M, K, N): the tile and split the kernel's choice takes on 132 multiprocessors --
# 128 rows, 2 blocks a cluster; 256 rows, no split; 256 rows, 2 a cluster; 128 rows,
# no split; a whole round of 256 rows without a split and the last tiles over 2 blocks
# each, rows past the last tile (132 or 144 multiprocessors) -- rows past the last
# tile, and a single row.
SHAPES = [(512, 4096, 1024), (512, 256, 16384), (512, 4096, 4096), (512, 1024, 4096),
          (1000, 2048, 6144), (300, 1024, 768), (77, 512, 256), (1, 1024, 128)]


@hopper
@pytest.mark.parametrize("M,K,N", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("G", [64, 128])
def test_kernel_is_within_tolerance_and_deterministic(M, K, N, dtype, G):
    qweight, qzeros, scales = random_layer(K, N, G, dtype, seed=M + K, device="cuda")
    gen = torch.Generator().manual_seed(N)
    x = torch.randn(M, K, generator=gen).to(dtype).cuda()
    y = prepared_call(x, qweight, qzeros, scales, G)
    assert y.shape == (M, N) and y.dtype == dtype
    assert_linear_close(y.cpu(), x.cpu(), qweight.cpu(), qzeros.cpu(), scales.cpu(), None, G)
    assert torch.equal(y, prepared_call(x, qweight, qzeros, scales, G))


@hopper
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_kernel_adds_the_bias_takes_leading_dimensions_and_writes_out(dtype):
    K, N, G = 1024, 768, 128
    qweight, qzeros, scales = random_layer(K, N, G, dtype, seed=5, device="cuda")
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(3, 100, K, generator=gen).to(dtype).cuda()
    bias = torch.randn(N, generator=gen).to(dtype).cuda()
    y = prepared_call(x, qweight, qzeros, scales, G, bias)
    assert y.shape == (3, 100, N)
    assert_linear_close(y.reshape(-1, N).cpu(), x.reshape(-1, K).cpu(), qweight.cpu(), qzeros.cpu(),
                        scales.cpu(), bias.cpu(), G)
    out = torch.full((3, 100, N), float("nan"), dtype=dtype, device="cuda")
    assert prepared_call(x, qweight, qzeros, scales, G, bias, out) is out
    assert torch.equal(out, y)


@hopper
def test_kernel_refuses_bad_arguments_and_leaves_out_untouched():
    K, N, G = 256, 256, 64
    qweight, qzeros, scales = random_layer(K, N, G, torch.float16, device="cuda")
    words, operands = _prefill.layout(qweight, qzeros, scales, G)
    x = torch.randn(200, K, device="cuda").half()
    out = torch.zeros(200, N, device="cuda", dtype=torch.float16)
    call = awq._C._linear_prepared
    cases = [
        (ValueError, "16-byte aligned",
         (torch.zeros(200 * K + 1, device="cuda", dtype=torch.float16)[1:].view(200, K), words, operands,
          None, G, out)),
        (ValueError, "elements", (x, words.reshape(-1)[:words.numel() // 2], operands, None, G, out)),
        (ValueError, "operands has", (x, words, operands[:1], None, G, out)),
        (ValueError, "group_size", (x, words, operands, None, 96, out)),
        (ValueError, "bias must have shape", (x, words, operands, torch.zeros(N + 8, device="cuda").half(), G,
                                              out)),
        (TypeError, "x's dtype", (x, words, operands, None, G, out.bfloat16())),
        (ValueError, "out must have", (x, words, operands, None, G, out[:100])),
        (ValueError, "is on cpu", (x, words.cpu(), operands, None, G, out)),
        (ValueError, "in_features a multiple of 128", (x[:, :192].contiguous(), words, operands, None, G, out)),
        (ValueError, "C-contiguous", (x.t(), words, operands, None, G, out)),
    ]
    for exc, match, args in cases:
        with pytest.raises(exc, match=match):
            call(*args)
        assert not out.any()
    overlap = torch.zeros(200, K, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="overlaps x"):
        call(overlap, words, operands, None, G, overlap[:, :N])


def hopper_layer(K=1024, N=768, G=128, dtype=torch.float16, bias=True, seed=0):
    torch.manual_seed(seed)
    return AWQLinear.from_linear(nn.Linear(K, N, bias=bias).to("cuda", dtype), G)


@hopper
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_prepared_layer_runs_many_rows_on_the_kernel_and_few_on_linear(dtype, monkeypatch):
    layer = hopper_layer(dtype=dtype)
    report = prepare_prefill(layer, min_rows=100)
    assert report["skipped"] == {} and report["bytes"] == layer.qweight.nbytes + 4 * layer.scales.nbytes
    calls = []
    real = _prefill._linear_prepared
    monkeypatch.setattr(_prefill, "_linear_prepared", lambda *a: calls.append(a[0].shape) or real(*a))
    gen = torch.Generator().manual_seed(1)
    least = 100
    for rows in (1, least - 1, least, 2 * least + 5):
        x = torch.randn(rows, 1024, generator=gen).to(dtype).cuda()
        with torch.no_grad():
            y = layer(x)
        assert_linear_close(y.cpu(), x.cpu(), layer.qweight.cpu(), layer.qzeros.cpu(), layer.scales.cpu(),
                            layer.bias.cpu(), 128)
    assert calls == [(least, 1024), (2 * least + 5, 1024)]
    prepare_prefill(layer, enable=False)
    assert layer._prefill is None
    layer(x)
    assert len(calls) == 2


@hopper
def test_a_prepared_layer_follows_its_buffers():
    layer, other = hopper_layer(seed=0), hopper_layer(seed=1)
    prepare_prefill(layer)
    x = torch.randn(512, 1024, device="cuda").half()
    with torch.no_grad():
        layer.load_state_dict(other.state_dict())  # written in place: prepared again
        y = layer(x)
        assert_linear_close(y.cpu(), x.cpu(), other.qweight.cpu(), other.qzeros.cpu(), other.scales.cpu(),
                            other.bias.cpu(), 128)
        layer.to(torch.bfloat16)  # converted: the layout is the bfloat16 one
        assert layer._prefill is not None and layer._prefill.dtype == torch.bfloat16
        y = layer(x.bfloat16())
        assert_linear_close(y.cpu(), x.bfloat16().cpu(), layer.qweight.cpu(), layer.qzeros.cpu(),
                            layer.scales.cpu(), layer.bias.cpu(), 128)
        layer.cpu()  # nowhere to run it: dropped
        assert layer._prefill is None
    assert "_prefill" not in "".join(layer.state_dict())


@hopper
def test_a_prepared_layer_replays_from_a_cuda_graph():
    layer = hopper_layer()
    prepare_prefill(layer)
    x = torch.randn(512, 1024, device="cuda").half()
    with torch.no_grad():
        want = layer(x)
        graph, y = capture_cuda_graph(lambda: layer(x))
        x.copy_(torch.randn(512, 1024, device="cuda").half())
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, layer(x)) and not torch.equal(y, want)


@hopper
def test_a_fused_group_shares_one_layout():
    torch.manual_seed(0)
    block = nn.ModuleDict({"q": nn.Linear(512, 512), "k": nn.Linear(512, 256)}).to("cuda", torch.float16)
    from awq_fast_dequant.torch import quantize_model
    assert quantize_model(block, 128) == []
    reference = copy.deepcopy(block)

    class Two(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.d = d

        def forward(self, x):
            return self.d["q"](x), self.d["k"](x)

    model = Two(block)
    x = torch.randn(512, 512, device="cuda").half()
    prepare_prefill(model)  # before fusing: the group takes over the layers' layouts
    assert fuse_projections(model, x) == [("d.q", "d.k")]
    fused = block["q"]._siblings.fused
    assert fused._prefill is not None and block["q"]._prefill is None and block["k"]._prefill is None
    with torch.no_grad():
        q, k = model(x)
        for got, name in ((q, "q"), (k, "k")):
            r = reference[name]
            assert_linear_close(got.cpu(), x.cpu(), r.qweight.cpu(), r.qzeros.cpu(), r.scales.cpu(),
                                r.bias.cpu(), 128)
