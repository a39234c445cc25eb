"""Hostile and unusual callers: fork, lazy tensors, foreign protocol objects,
integer-like arguments, streams on the CPU, a missing GPU, a symlinked cache.

Each test holds one class of input to the package's promise: never a crash,
never a hang, never a silent wrong answer, a clear exception otherwise.
"""

import ctypes
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import awq_fast_dequant as awq
from awq_fast_dequant import _C, reference

from conftest import child_env, make_problem

bits = reference.to_bits

# A layer large enough that the CPU backend runs a parallel region (several
# row chunks), small enough to be quick.
FORK_K, FORK_N, FORK_G = 256, 512, 64


def _fork_layer():
    rng = np.random.default_rng(7)
    qw, qz, sc = make_problem(rng, FORK_K, FORK_N, FORK_G, "float16")
    return qw, qz, sc, reference.dequantize(qw, qz, sc)


def _child_status(pid, timeout):
    """Exit status of a forked child, or None when it did not end in time
    (it is then killed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def _fork_and_dequantize(fn):
    """Forks; the child calls fn() three times and exits 0 when every result
    is bit-exact.  Returns the child's exit code (None: it hung)."""
    qw, qz, sc, ref = _fork_layer()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            ok = all(np.array_equal(bits(fn(qw, qz, sc)), bits(ref)) for _ in range(3))
            code = 0 if ok else 3
        except BaseException:
            code = 2
        os._exit(code)
    return _child_status(pid, timeout=60)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_fork_after_a_cpu_call():
    qw, qz, sc, ref = _fork_layer()
    assert np.array_equal(bits(awq.dequantize(qw, qz, sc)), bits(ref))  # the parent's pool runs
    assert _fork_and_dequantize(awq.dequantize) == 0
    assert np.array_equal(bits(awq.dequantize(qw, qz, sc)), bits(ref))  # and still runs


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_fork_after_a_smart_call(tmp_path, monkeypatch):
    monkeypatch.setenv("AWQ_FAST_DEQUANT_CACHE_DIR", str(tmp_path))
    _C._dev.cache_reload()
    try:
        qw, qz, sc, ref = _fork_layer()
        assert np.array_equal(bits(awq.smart_dequantize(qw, qz, sc)), bits(ref))  # tunes
        assert _fork_and_dequantize(awq.smart_dequantize) == 0
        assert _fork_and_dequantize(awq.dequantize) == 0
    finally:
        _C._dev.cache_reload()


def _pool_task(seed):
    rng = np.random.default_rng(seed)
    qw, qz, sc = make_problem(rng, FORK_K, FORK_N, FORK_G, "float16")
    return np.array_equal(bits(awq.dequantize(qw, qz, sc)), bits(reference.dequantize(qw, qz, sc)))


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(),
                    reason="needs the fork start method")
def test_fork_pool_runs_several_calls():
    _fork_layer()  # nothing shared; the parent's call below starts the pool
    qw, qz, sc, ref = _fork_layer()
    awq.dequantize(qw, qz, sc)
    with multiprocessing.get_context("fork").Pool(2) as pool:
        results = pool.map_async(_pool_task, range(6)).get(timeout=60)
    assert results == [True] * 6


# ---- arrays without memory, foreign protocol objects ----

class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class _RawDLPack:
    """A legacy DLPack producer of a 2-D C-contiguous array at a given data
    pointer and device (the pointer is never read unless it is valid)."""

    def __init__(self, data, shape, code, nbits, device=(1, 0)):
        self._shape = (ctypes.c_int64 * 2)(*shape)
        self._mt = _DLManagedTensor()
        t = self._mt.dl_tensor
        t.data, (t.device_type, t.device_id), t.ndim = data, device, 2
        t.code, t.bits, t.lanes = code, nbits, 1
        t.shape, t.strides, t.byte_offset = self._shape, None, 0
        self._device = device

    def __dlpack_device__(self):
        return self._device

    def __dlpack__(self, stream=None, max_version=None):
        new = ctypes.pythonapi.PyCapsule_New
        new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p,
                                                       ctypes.c_void_p]
        return new(ctypes.addressof(self._mt), b"dltensor", None)


def test_null_data_pointer_is_a_value_error():
    qw, qz, sc, _ = _fork_layer()
    null_qw = _RawDLPack(None, qw.shape, 0, 32)  # kDLInt, NULL data, non-zero shape
    with pytest.raises(ValueError, match="qweight has no memory behind it"):
        awq.dequantize(null_qw, qz, sc)
    out = np.full((FORK_K, FORK_N), 7, np.float16)
    null_out = _RawDLPack(None, out.shape, 2, 16)
    with pytest.raises(ValueError, match="out has no memory behind it"):
        awq.dequantize(qw, qz, sc, out=null_out)


def test_efficient_zero_tensors_are_rejected():
    torch = pytest.importorskip("torch")
    qw, qz, sc, _ = _fork_layer()
    tqw, tqz, tsc = torch.from_numpy(qw), torch.from_numpy(qz), torch.from_numpy(sc)
    zeros = torch._efficientzerotensor(tsc.shape, dtype=torch.float16)
    with pytest.raises(ValueError, match="scales has no memory behind it.*clone"):
        awq.dequantize(tqw, tqz, zeros)
    zout = torch._efficientzerotensor((FORK_K, FORK_N), dtype=torch.float16)
    with pytest.raises(ValueError, match="out has no memory behind it"):
        awq.dequantize(tqw, tqz, tsc, out=zout)


def test_exchange_api_attribute_that_is_not_the_capsule_is_ignored():
    """An int, None or a capsule of another name under
    __dlpack_c_exchange_api__ is not a table of functions: the object is read
    through __dlpack__.  Run in a child: the old behaviour was a segfault."""
    code = textwrap.dedent("""
        import ctypes, numpy as np, awq_fast_dequant as awq
        from awq_fast_dequant import reference
        rng = np.random.default_rng(3)
        qw = rng.integers(0, 2**32, (64, 4), dtype=np.uint64).astype(np.uint32).view(np.int32)
        qz = rng.integers(0, 2**32, (1, 4), dtype=np.uint64).astype(np.uint32).view(np.int32)
        sc = rng.standard_normal((1, 32)).astype(np.float16)
        new = ctypes.pythonapi.PyCapsule_New
        new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        for attr in (12345, None, new(id(qw), b"not_dlpack_exchange_api", None),
                     new(id(qw), b"dlpack_exchange_api_v0", None)):
            class Wrapped:
                __dlpack_c_exchange_api__ = attr
                def __init__(self, a): self.a = a
                def __dlpack__(self, **kw): return self.a.__dlpack__()
                def __dlpack_device__(self): return (1, 0)
            got = awq.dequantize(Wrapped(qw), Wrapped(qz), Wrapped(sc))
            ref = reference.dequantize(qw, qz, sc)
            assert np.array_equal(got.view(np.uint16), ref.view(np.uint16)), attr
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True,
                       text=True, timeout=120, cwd=os.path.dirname(os.path.abspath(__file__)))
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stderr[-2000:])


# ---- torch's lazy negation and conjugation ----

def test_negative_bit_is_rejected_in_inputs_and_out():
    torch = pytest.importorskip("torch")
    qw, qz, sc, _ = _fork_layer()
    tqw, tqz, tsc = torch.from_numpy(qw), torch.from_numpy(qz), torch.from_numpy(sc)
    with pytest.raises(ValueError, match=r"scales has its negative bit set.*resolve_neg\(\)"):
        awq.dequantize(tqw, tqz, torch._neg_view(tsc))
    with pytest.raises(ValueError, match=r"qweight has its negative bit set"):
        awq.dequantize(torch._neg_view(tqw), tqz, tsc)
    out = torch.full((FORK_K, FORK_N), 7.0, dtype=torch.float16)
    neg_out = torch._neg_view(out)
    with pytest.raises(ValueError, match=r"out has its negative bit set.*resolve_neg\(\)"):
        awq.dequantize(tqw, tqz, tsc, out=neg_out)
    assert (out == 7.0).all()  # untouched
    # resolved, it is an ordinary tensor and gives the negated scales' result
    got = awq.dequantize(tqw, tqz, torch._neg_view(tsc).resolve_neg())
    want = reference.dequantize(qw, qz, -sc)
    assert np.array_equal(bits(got.numpy()), bits(want))


def test_conjugate_bit_tensors_are_rejected():
    """The conjugate bit exists on complex tensors only, which no argument
    accepts: the dtype error names what is expected."""
    torch = pytest.importorskip("torch")
    qw, qz, sc, _ = _fork_layer()
    conj = torch.ones(sc.shape, dtype=torch.complex64).conj()
    assert conj.is_conj()
    with pytest.raises(TypeError, match="scales must be float16, bfloat16 or float32"):
        awq.dequantize(torch.from_numpy(qw), torch.from_numpy(qz), conj)


# ---- integer arguments, kernel names, streams ----

def test_integer_arguments_take_index_objects():
    qw, qz, sc, ref = _fork_layer()
    for g in (np.int64(FORK_G), np.int32(FORK_G), np.uint16(FORK_G)):
        assert np.array_equal(bits(awq.dequantize(qw, qz, sc, group_size=g)), bits(ref))
    # accepted as an integer, then judged by value: block_size is CUDA-only
    with pytest.raises(ValueError, match="block_size applies to the CUDA kernels"):
        awq.dequantize(qw, qz, sc, block_size=np.int64(128))
    with pytest.raises(TypeError, match="group_size must be an int"):
        awq.dequantize(qw, qz, sc, group_size=np.float32(64))
    with pytest.raises(TypeError, match="group_size must be an int"):
        awq.dequantize(qw, qz, sc, group_size=True)


@pytest.mark.parametrize("kernel", [4, b"v4", None.__class__, ["v4"]])
def test_kernel_that_is_not_a_str_is_a_type_error(kernel):
    qw, qz, sc, _ = _fork_layer()
    with pytest.raises(TypeError, match="kernel must be a str"):
        awq.dequantize(qw, qz, sc, kernel=kernel)


@pytest.mark.parametrize("stream", [0, 1, 7, np.int64(0)])
def test_stream_for_cpu_inputs_is_always_rejected(stream):
    qw, qz, sc, _ = _fork_layer()
    out = np.full((FORK_K, FORK_N), 7, np.float16)
    for call in (awq.dequantize, awq.smart_dequantize):
        with pytest.raises(ValueError, match="stream applies to CUDA tensors"):
            call(qw, qz, sc, out=out, stream=stream)
    assert (out == 7).all()
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="stream applies to CUDA tensors"):
        awq.dequantize(torch.from_numpy(qw), torch.from_numpy(qz), torch.from_numpy(sc),
                       stream=stream)


# ---- CUDA tensors where no GPU can run them ----

@pytest.mark.skipif(awq.cuda_available(), reason="needs a machine without a usable GPU")
def test_cuda_tensor_without_a_usable_gpu_says_so():
    buf = np.zeros(1 << 16, np.uint8)  # never read: the launch cannot happen
    ptr = buf.ctypes.data
    qw = _RawDLPack(ptr, (64, 4), 0, 32, device=(2, 0))
    qz = _RawDLPack(ptr, (1, 4), 0, 32, device=(2, 0))
    sc = _RawDLPack(ptr + 4096, (1, 32), 2, 16, device=(2, 0))
    out = _RawDLPack(ptr + 8192, (64, 32), 2, 16, device=(2, 0))
    expected = ("built without CUDA" if not awq.build_info()["cuda"]
                else "no usable CUDA device")
    with pytest.raises(RuntimeError, match=expected):
        awq.dequantize(qw, qz, sc, out=out)


# ---- the autotune cache behind a symbolic link ----

def test_symlinked_cache_file_is_written_through(tmp_path, monkeypatch):
    real = tmp_path / "shared" / "tuned.txt"
    real.parent.mkdir()
    cache = tmp_path / "cache"
    cache.mkdir()
    link = cache / "autotune.txt"
    link.symlink_to(real)  # dangling until the first save creates the target
    monkeypatch.setenv("AWQ_FAST_DEQUANT_CACHE_DIR", str(cache))
    monkeypatch.delenv("AWQ_FAST_DEQUANT_AUTOTUNE", raising=False)
    _C._dev.cache_reload()
    try:
        qw, qz, sc, ref = _fork_layer()
        assert np.array_equal(bits(awq.smart_dequantize(qw, qz, sc)), bits(ref))
        assert link.is_symlink() and os.readlink(link) == str(real)
        text = real.read_text()
        assert text.startswith("# awq_fast_dequant autotune cache") and f"\t{FORK_K}\t" in text
        rng = np.random.default_rng(1)
        qw2, qz2, sc2 = make_problem(rng, 128, 64, 64, "float32")
        awq.smart_dequantize(qw2, qz2, sc2)  # a second save merges through the link
        assert link.is_symlink()
        assert len([ln for ln in real.read_text().splitlines() if not ln.startswith("#")]) == 2
        awq.clear_cache()
        assert link.is_symlink() and not real.exists()
    finally:
        _C._dev.cache_reload()


# ---- tensors a producer cannot export ----

def test_a_producer_whose_dlpack_device_raises_gets_the_packages_error():
    # as torch's __dlpack_device__ does for a meta tensor where it has no exchange API
    class NoDevice:
        def __dlpack__(self, stream=None, max_version=None):
            raise AssertionError("never asked: the device comes first")

        def __dlpack_device__(self):
            raise ValueError("Unknown device type meta for Dlpack")

    qw, qz, sc, _ = _fork_layer()
    with pytest.raises(TypeError, match="qweight .* cannot be read as an array in CPU or CUDA "
                                       "memory: Unknown device type meta") as info:
        awq.dequantize(NoDevice(), qz, sc)
    assert isinstance(info.value.__cause__, ValueError)
    before = qw.copy()
    with pytest.raises(TypeError, match="out .* cannot be read as an array"):
        awq.dequantize(qw, qz, sc, out=NoDevice())
    assert np.array_equal(qw, before)


@pytest.mark.parametrize("kind", ["meta", "sparse"])
def test_tensors_without_readable_memory_get_the_packages_error(kind):
    torch = pytest.importorskip("torch")
    qw, qz, sc, _ = _fork_layer()
    tqw = torch.from_numpy(qw)
    bad = tqw.to("meta") if kind == "meta" else tqw.to_sparse()
    with pytest.raises(TypeError, match="qweight .* cannot be read as an array") as info:
        awq.dequantize(bad, torch.from_numpy(qz), torch.from_numpy(sc))
    assert isinstance(info.value.__cause__, Exception)  # the producer's own words, chained
    out = torch.full((FORK_K, FORK_N), 7.0, dtype=torch.float16)
    with pytest.raises(TypeError, match="out .* cannot be read as an array"):
        awq.dequantize(tqw, torch.from_numpy(qz), torch.from_numpy(sc),
                       out=out.to("meta") if kind == "meta" else out.to_sparse())
