"""The CUDA backend: every kernel against the NumPy reference, streams,
graphs, devices, frameworks.  Skipped without a usable GPU."""

import functools
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import awq_fast_dequant as awq
from awq_fast_dequant import reference

from conftest import DTYPES, child_env, make_problem, torch_problem

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not awq.cuda_available(), reason="needs a CUDA GPU")]

torch = pytest.importorskip("torch") if awq.cuda_available() else None
KERNELS = ("v1", "v2", "v3", "v4", "auto")
PAIRS = [(s, o) for s in DTYPES for o in DTYPES]


to_cuda = functools.partial(torch_problem, device="cuda")


def check(got, qw, qz, sc, out_dtype=None):
    torch.cuda.synchronize()
    reference.assert_bitexact(got, reference.dequantize(qw, qz, sc, out_dtype=out_dtype))


def _shapes():
    for G in (32, 128):
        for K in (G, 7 * G):
            for N in (8, 136, 4104):
                yield K, N, G
    for K in (8, 200):  # G = K
        for N in (8, 136, 4104):
            yield K, N, K


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("scale_dtype,out_dtype", PAIRS)
def test_kernels_bitexact(rng, kernel, scale_dtype, out_dtype):
    for K, N, G in _shapes():
        qw, qz, sc = to_cuda(rng, K, N, G, scale_dtype)
        got = awq.dequantize(qw, qz, sc, out_dtype=out_dtype, kernel=kernel)
        assert got.is_cuda and got.dtype == getattr(torch, out_dtype) and got.shape == (K, N)
        check(got, qw, qz, sc, out_dtype)


@pytest.mark.parametrize("kernel", ["v3", "v4"])
@pytest.mark.parametrize("block_size", [32, 64, 128, 256, 512, 1024])
def test_block_sizes(rng, kernel, block_size):
    qw, qz, sc = to_cuda(rng, 7 * 128, 4104, 128, "float16")
    got = awq.dequantize(qw, qz, sc, kernel=kernel, block_size=block_size)
    check(got, qw, qz, sc)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("offset", [1, 2, 3])
def test_misaligned_pointers(rng, kernel, offset):
    """Views at element offsets that break 16-byte alignment take the scalar path."""
    K, N, G = 256, 136, 64
    qw, qz, sc = to_cuda(rng, K, N, G, "float16")

    def shifted(t):
        flat = torch.empty(t.numel() + offset, dtype=t.dtype, device=t.device)
        view = flat[offset:].view(t.shape)
        view.copy_(t)
        return view

    qw2, qz2, sc2 = shifted(qw), shifted(qz), shifted(sc)
    out_flat = torch.full((K * N + offset,), 7.0, dtype=torch.float16, device="cuda")
    out = out_flat[offset:].view(K, N)
    awq.dequantize(qw2, qz2, sc2, out=out, kernel=kernel)
    check(out, qw, qz, sc)
    assert (out_flat[:offset] == 7).all()


@pytest.mark.parametrize("rows", [1, 2, 4, 8, 16, 64])
@pytest.mark.parametrize("dtype", DTYPES)
def test_v4_rows_lean_and_general(rng, rows, dtype):
    """v4 has two kernels: the lean one (rows 1/2/4/8 dividing G) and the general
    one (more rows than 8, or rows not dividing G: a group's last tile is short).
    Every rows value, partial column blocks, and a misaligned output (scalar path)."""
    for K, N, G in ((7 * 128, 4104, 128), (200, 136, 200), (96, 8, 32), (96, 136, 48)):
        qw, qz, sc = to_cuda(rng, K, N, G, dtype)
        for block in (32, 96, 256):
            out = torch.full((K, N), 7.0, dtype=getattr(torch, dtype), device="cuda")
            awq._C._dev.launch_config(qw, qz, sc, out, "v4", block, rows)
            check(out, qw, qz, sc)
        flat = torch.full((K * N + 1,), 7.0, dtype=getattr(torch, dtype), device="cuda")
        awq._C._dev.launch_config(qw, qz, sc, flat[1:].view(K, N), "v4", 64, rows)
        check(flat[1:].view(K, N), qw, qz, sc)
        assert flat[0].item() == 7.0


@pytest.mark.parametrize("dtype", DTYPES)
def test_v4_large_layer_with_prefetch(rng, dtype):
    """Outputs over 8 MB take the write-back mode, where a thread also asks L2
    for the rows of the unit one wave of blocks ahead; with W = 1025 words the
    last column block of every tile has one lane, and the last wave has no
    unit ahead of it.  Every lean rows value; 64 and 512 are the default
    blocks below and above 32M elements."""
    K, N, G = 1024, 8200, 128
    assert K * N * 2 > 8 << 20
    qw, qz, sc = to_cuda(rng, K, N, G, dtype)
    expect = reference.dequantize(qw, qz, sc)
    for rows in (1, 2, 4, 8):
        for block in (64, 96, 512):
            out = torch.full((K, N), 7.0, dtype=getattr(torch, dtype), device="cuda")
            awq._C._dev.launch_config(qw, qz, sc, out, "v4", block, rows)
            torch.cuda.synchronize()
            reference.assert_bitexact(out, expect)


@pytest.mark.parametrize("kernel", KERNELS)
def test_zero_size(kernel):
    for K, N in ((0, 16), (64, 0)):
        qw = torch.zeros((K, N // 8), dtype=torch.int32, device="cuda")
        qz = torch.zeros((K // 32, N // 8), dtype=torch.int32, device="cuda")
        sc = torch.zeros((K // 32, N), dtype=torch.float16, device="cuda")
        got = awq.dequantize(qw, qz, sc, group_size=32, kernel=kernel)
        assert got.shape == (K, N) and got.is_cuda


def test_more_than_2_31_elements():
    """K * N > 2^31 (and the byte offsets > 2^32): 64-bit index math."""
    K, N, G = 32768, 65544, 128
    assert K * N > 2**31
    g = torch.Generator(device="cuda").manual_seed(3)
    qw = torch.randint(-2**31, 2**31 - 1, (K, N // 8), dtype=torch.int32, device="cuda",
                       generator=g)
    qz = torch.randint(-2**31, 2**31 - 1, (K // G, N // 8), dtype=torch.int32, device="cuda",
                       generator=g)
    sc = torch.randn((K // G, N), device="cuda", generator=g).half()
    out = torch.empty((K, N), dtype=torch.float16, device="cuda")
    # v4's general kernel (rows 16) as well as the lean one that "v4"/"auto" take
    launches = [lambda k=k: awq.dequantize(qw, qz, sc, out=out, kernel=k) for k in KERNELS]
    launches.append(lambda: awq._C._dev.launch_config(qw, qz, sc, out, "v4", 256, 16))
    for launch in launches:
        out.fill_(float("nan"))
        launch()
        torch.cuda.synchronize()
        for grp in (0, K // G // 2, K // G - 1):
            rows = slice(grp * G, grp * G + G)
            expect = reference.dequantize(qw[rows].cpu(), qz[grp:grp + 1].cpu(),
                                          sc[grp:grp + 1].cpu())
            reference.assert_bitexact(out[rows], expect)
        # nothing left unwritten anywhere (the NaN poison is gone)
        assert not torch.isnan(out).any().item() or torch.isnan(sc).any().item()


def test_side_stream_ordering(rng):
    """Inputs produced on a side stream are consumed after they are ready,
    whether the stream comes from the context or the argument."""
    K, N, G = 1024, 4096, 128
    qw, qz, sc = make_problem(rng, K, N, G, "float16", specials=False)
    expect = reference.dequantize(qw, qz, sc)
    host = [torch.from_numpy(a).pin_memory() for a in (qw, qz, sc)]
    for mode in ("context", "argument"):
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            dev = [torch.empty_like(h, device="cuda") for h in host]
            torch.cuda._sleep(50_000_000)  # the copies land well after the launch is queued
            for d, h in zip(dev, host):
                d.copy_(h, non_blocking=True)
            if mode == "context":
                got = awq.dequantize(*dev)
        if mode == "argument":
            got = torch.empty((K, N), dtype=torch.float16, device="cuda")
            awq.dequantize(*dev, out=got, stream=s)
        s.synchronize()
        reference.assert_bitexact(got, expect)


def test_explicit_stream_handshake(rng):
    """stream= that differs from torch's current stream: the inputs written on
    the current stream are waited for (DLPack handshake)."""
    K, N, G = 1024, 4096, 128
    qw, qz, sc = make_problem(rng, K, N, G, "float16", specials=False)
    expect = reference.dequantize(qw, qz, sc)
    host = [torch.from_numpy(a).pin_memory() for a in (qw, qz, sc)]
    dev = [torch.empty_like(h, device="cuda") for h in host]
    torch.cuda._sleep(50_000_000)
    for d, h in zip(dev, host):
        d.copy_(h, non_blocking=True)  # on the current (default) stream
    s = torch.cuda.Stream()
    out = torch.empty((K, N), dtype=torch.float16, device="cuda")
    awq.dequantize(*dev, out=out, stream=s)
    s.synchronize()
    reference.assert_bitexact(out, expect)


def test_cuda_graph_capture_and_replay(rng):
    K, N, G = 512, 1024, 128
    qw, qz, sc = to_cuda(rng, K, N, G, "float16")
    out = torch.empty((K, N), dtype=torch.float16, device="cuda")
    awq.dequantize(qw, qz, sc, out=out)  # warm-up outside capture
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        awq.dequantize(qw, qz, sc, out=out)
    for _ in range(2):
        new = to_cuda(rng, K, N, G, "float16")
        for dst, src in zip((qw, qz, sc), new):
            dst.copy_(src)
        out.fill_(0)
        graph.replay()
        check(out, *new)


def test_cuda_errors_are_runtime_errors_not_crashes(rng):
    qw, qz, sc = to_cuda(rng, 64, 64, 32, "float16")
    with pytest.raises(ValueError, match="all tensors must be on one device"):
        awq.dequantize(qw, qz, sc.cpu())
    with pytest.raises(ValueError, match="kernel 'cpu' needs host arrays"):
        awq.dequantize(qw, qz, sc, kernel="cpu")
    with pytest.raises(ValueError, match="block_size must be a multiple of 32"):
        awq.dequantize(qw, qz, sc, kernel="v3", block_size=100)
    with pytest.raises(ValueError, match="block_size applies"):
        awq.dequantize(qw, qz, sc, kernel="v1", block_size=128)


def test_empty_launch_floor(rng):
    """The benchmark's host-time floor launches on the given device and stream
    and leaves no error behind; a device that does not exist is an error."""
    from awq_fast_dequant import _C
    dev = torch.cuda.current_device()
    side = torch.cuda.Stream()
    assert _C._dev.empty_launch(dev, side.cuda_stream) is None
    assert _C._dev.empty_launch(dev, 0) is None
    with pytest.raises(RuntimeError, match=f"CUDA device {torch.cuda.device_count()} is not "):
        _C._dev.empty_launch(torch.cuda.device_count(), 0)
    assert torch.cuda.current_device() == dev
    qw, qz, sc = to_cuda(rng, 128, 136, 32, "float16")
    check(awq.dequantize(qw, qz, sc), qw, qz, sc)


def test_launches_go_through_the_driver():
    """With a CUDA 12.5+ runtime the kernels go out through cuLaunchKernel
    (the faster path; every other test here runs on it)."""
    from awq_fast_dequant import _C
    if awq.build_info()["cuda_runtime_version"] < 12050:
        assert _C._dev.launch_path() == "runtime"
    else:
        assert _C._dev.launch_path() == "driver"


def test_a_fresh_thread_launches(rng):
    """A thread that never touched CUDA has no current context: its first
    launch takes the runtime path, which binds the device's context; the
    launches after it take the driver path.  Every result is bit-exact."""
    problems = [to_cuda(rng, 7 * 32, 136, 32, dt) for dt in DTYPES]
    got, errors = [], []

    def work():
        try:
            for kernel in KERNELS:
                for qw, qz, sc in problems:
                    got.append((awq.dequantize(qw, qz, sc, kernel=kernel), qw, qz, sc))
            torch.cuda.synchronize()
        except BaseException as exc:  # re-raised below, in the test's thread
            errors.append(exc)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    if errors:
        raise errors[0]
    assert len(got) == len(KERNELS) * len(problems)
    for out, qw, qz, sc in got:
        check(out, qw, qz, sc)


_RUNTIME_PATH_SCRIPT = """
import sys
import numpy as np, torch
import awq_fast_dequant as awq
from awq_fast_dequant import _C, reference
sys.path.insert(0, sys.argv[1])
from conftest import make_problem
assert _C._dev.launch_path() == "runtime", _C._dev.launch_path()
rng = np.random.default_rng(5)
for K, N, G in ((7 * 32, 136, 32), (256, 4104, 128)):
    qw, qz, sc = make_problem(rng, K, N, G, "float16")
    want = reference.dequantize(qw, qz, sc)
    t = [torch.from_numpy(a).cuda() for a in (qw, qz, sc)]
    for kernel in ("v1", "v2", "v3", "v4"):
        got = awq.dequantize(*t, kernel=kernel)
        reference.assert_bitexact(got.cpu().numpy(), want)
    out = torch.empty((K, N), dtype=torch.float16, device="cuda")
    _C._dev.empty_launch(torch.cuda.current_device(), 0)
    with torch.cuda.stream(torch.cuda.Stream()):
        awq.dequantize(*t, out=out)
    torch.cuda.synchronize()
    reference.assert_bitexact(out.cpu().numpy(), want)
print("runtime path ok")
"""


def test_runtime_launch_path_is_bitexact():
    """AWQ_FAST_DEQUANT_RUNTIME_LAUNCH=1 keeps every launch on cudaLaunchKernel
    (the fallback path): every kernel, a side stream and the floor's launch."""
    env = child_env(AWQ_FAST_DEQUANT_RUNTIME_LAUNCH="1")
    tests = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([sys.executable, "-c", _RUNTIME_PATH_SCRIPT, tests], env=env, cwd=tests,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "runtime path ok" in r.stdout


@pytest.mark.skipif(awq.cuda_available() and torch.cuda.device_count() < 2,
                    reason="needs two GPUs")
def test_second_device(rng):
    for dev in ("cuda:1", "cuda:0"):
        qw, qz, sc = to_cuda(rng, 256, 4104, 128, "bfloat16", device=dev)
        before = torch.cuda.current_device()
        for kernel in KERNELS:
            got = awq.dequantize(qw, qz, sc, kernel=kernel)
            assert got.device == torch.device(dev)
            check(got, qw, qz, sc)
        assert torch.cuda.current_device() == before  # set and restored
    a = to_cuda(rng, 64, 64, 32, "float16", device="cuda:0")
    b = to_cuda(rng, 64, 64, 32, "float16", device="cuda:1")
    with pytest.raises(ValueError, match="qweight is on cuda:0 but scales is on cuda:1"):
        awq.dequantize(a[0], a[1], b[2])


def test_cupy_in_cupy_out(rng):
    cupy = pytest.importorskip("cupy")
    qw, qz, sc = make_problem(rng, 256, 136, 64, "float16")
    c = [cupy.asarray(a) for a in (qw, qz, sc)]
    for kernel in KERNELS:
        got = awq.dequantize(*c, kernel=kernel, out_dtype="float32")
        assert isinstance(got, cupy.ndarray) and got.dtype == np.float32
        reference.assert_bitexact(got.get(), reference.dequantize(qw, qz, sc, out_dtype="float32"))
    out = cupy.full((256, 136), 3, dtype=cupy.float16)
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        awq.dequantize(*c, out=out)  # CuPy's current stream is used
    s.synchronize()
    reference.assert_bitexact(out.get(), reference.dequantize(qw, qz, sc))


def test_cupy_current_stream_of_the_arrays_device():
    """The stream a CuPy call launches on by default: CuPy's current stream of
    the array's device, whichever device is current."""
    cupy = pytest.importorskip("cupy")
    from awq_fast_dequant._frameworks import current_stream
    a = cupy.zeros(8)
    assert current_stream(a) == cupy.cuda.get_current_stream().ptr
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        assert current_stream(a) == s.ptr
    assert current_stream(a) != s.ptr
    if cupy.cuda.runtime.getDeviceCount() < 2:
        return
    with cupy.cuda.Device(1):
        b = cupy.zeros(8)
        s1 = cupy.cuda.Stream(non_blocking=True)
        with s1:
            with cupy.cuda.Device(0):
                assert current_stream(a) == cupy.cuda.get_current_stream().ptr
                assert current_stream(b) == s1.ptr
                assert cupy.cuda.runtime.getDevice() == 0
            assert current_stream(b) == s1.ptr


def test_torch_allocates_through_its_allocator(rng):
    qw, qz, sc = to_cuda(rng, 1024, 4096, 128, "float16")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    got = awq.dequantize(qw, qz, sc)
    assert torch.cuda.memory_allocated() - before >= got.numel() * 2
    check(got, qw, qz, sc)

