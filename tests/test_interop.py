"""Inputs through the NumPy C API (read-only too) and through DLPack (torch CPU,
generic producers, legacy producers); outputs in the caller's framework."""

import numpy as np
import pytest

import awq_fast_dequant as awq
from awq_fast_dequant import reference

from conftest import DTYPES, DLPackOnly, make_problem, np_dtype, torch_problem


def test_read_only_inputs_frombuffer(rng):
    qw, qz, sc = make_problem(rng, 128, 64, 32)
    ro = [np.frombuffer(a.tobytes(), dtype=a.dtype).reshape(a.shape) for a in (qw, qz, sc)]
    assert not any(a.flags.writeable for a in ro)
    reference.assert_bitexact(awq.dequantize(*ro), reference.dequantize(qw, qz, sc))


def test_read_only_memory_map(rng, tmp_path):
    """A read-only memory map (how converted checkpoints are often opened) is
    consumed in place, without a copy."""
    qw, qz, sc = make_problem(rng, 128, 64, 32)
    path = tmp_path / "layer.bin"
    path.write_bytes(qw.tobytes() + qz.tobytes() + sc.tobytes())
    mm = np.memmap(path, mode="r", dtype=np.uint8)
    a = mm[: qw.nbytes].view(np.int32).reshape(qw.shape)
    b = mm[qw.nbytes: qw.nbytes + qz.nbytes].view(np.int32).reshape(qz.shape)
    c = mm[qw.nbytes + qz.nbytes:].view(np.float16).reshape(sc.shape)
    assert not a.flags.writeable
    reference.assert_bitexact(awq.dequantize(a, b, c), reference.dequantize(qw, qz, sc))


@pytest.mark.parametrize("legacy", [False, True])
def test_generic_dlpack_producer(rng, legacy):
    qw, qz, sc = make_problem(rng, 64, 32, 32)
    wrapped = [DLPackOnly(a, legacy) for a in (qw, qz, sc)]
    got = awq.dequantize(*wrapped)
    assert isinstance(got, np.ndarray)  # a CPU producer we don't know: NumPy out
    reference.assert_bitexact(got, reference.dequantize(qw, qz, sc))
    assert all(w.calls and w.calls[0]["stream"] is None for w in wrapped)
    if not legacy:
        assert wrapped[0].calls[0]["max_version"] == (1, 0)


def test_dlpack_out_is_written(rng):
    qw, qz, sc = make_problem(rng, 64, 32, 32)
    out = np.zeros((64, 32), np.float16)
    awq.dequantize(qw, qz, sc, out=DLPackOnly(out))
    reference.assert_bitexact(out, reference.dequantize(qw, qz, sc))


# ---- torch CPU ----


@pytest.fixture
def torch_mod():
    return pytest.importorskip("torch")


@pytest.mark.parametrize("scale_dtype", DTYPES)
@pytest.mark.parametrize("out_dtype", [None, *DTYPES])
def test_torch_cpu(rng, torch_mod, scale_dtype, out_dtype):
    qw, qz, sc = torch_problem(rng, 128, 136, 32, scale_dtype)
    got = awq.dequantize(qw, qz, sc, out_dtype=out_dtype and getattr(torch_mod, out_dtype))
    assert isinstance(got, torch_mod.Tensor) and got.device.type == "cpu"
    assert got.dtype == getattr(torch_mod, out_dtype or scale_dtype)
    reference.assert_bitexact(got, reference.dequantize(qw, qz, sc, out_dtype=out_dtype))


def test_torch_out_and_slices(rng, torch_mod):
    qw, qz, sc = make_problem(rng, 256, 64, 64)
    big = torch_mod.full((300, 64), 5.0, dtype=torch_mod.float16)
    view = big[10:266]  # contiguous rows at an offset
    res = awq.dequantize(torch_mod.from_numpy(qw), torch_mod.from_numpy(qz),
                         torch_mod.from_numpy(sc), out=view)
    assert res is view
    reference.assert_bitexact(view, reference.dequantize(qw, qz, sc))
    assert (big[:10] == 5).all() and (big[266:] == 5).all()


def test_torch_noncontiguous_rejected(rng, torch_mod):
    qw, qz, sc = make_problem(rng, 64, 64, 32)
    t = torch_mod.from_numpy(qw).t().contiguous().t()
    with pytest.raises(ValueError, match=r"qweight is not C-contiguous; pass qweight.contiguous\(\)"):
        awq.dequantize(t, torch_mod.from_numpy(qz), torch_mod.from_numpy(sc))


def test_torch_out_wrong_dtype(rng, torch_mod):
    qw, qz, sc = make_problem(rng, 64, 64, 32)
    out = torch_mod.full((64, 64), 1.0, dtype=torch_mod.bfloat16)
    with pytest.raises(TypeError, match="out must have dtype float16"):
        awq.dequantize(torch_mod.from_numpy(qw), torch_mod.from_numpy(qz),
                       torch_mod.from_numpy(sc), out=out)
    assert (out == 1).all()


def test_mixed_numpy_and_torch(rng, torch_mod):
    """Frameworks may be mixed on one device; the output follows qweight."""
    qw, qz, sc = make_problem(rng, 64, 64, 32)
    got = awq.dequantize(torch_mod.from_numpy(qw), qz, sc)
    assert isinstance(got, torch_mod.Tensor)
    got = awq.dequantize(qw, torch_mod.from_numpy(qz), sc)
    assert isinstance(got, np.ndarray)


def test_torch_requires_grad_scales(rng, torch_mod):
    qw, qz, sc = make_problem(rng, 64, 64, 32, "float32", specials=False)
    tsc = torch_mod.from_numpy(sc).requires_grad_()
    try:
        got = awq.dequantize(torch_mod.from_numpy(qw), torch_mod.from_numpy(qz), tsc)
    except (RuntimeError, BufferError, TypeError) as e:  # torch refuses to export: clear error
        assert "grad" in str(e).lower()
    else:
        reference.assert_bitexact(got, reference.dequantize(qw, qz, sc))


def test_numpy_bfloat16_output(rng):
    np_dtype("bfloat16")
    qw, qz, sc = make_problem(rng, 64, 64, 32)
    got = awq.dequantize(qw, qz, sc, out_dtype="bfloat16")
    assert got.dtype == np_dtype("bfloat16")
    reference.assert_bitexact(got, reference.dequantize(qw, qz, sc, out_dtype="bfloat16"))
