"""DESIGN.md section 4: every rejected call raises the documented exception,
names the argument, and leaves `out` untouched."""

import numpy as np
import pytest

import awq_fast_dequant as awq

from conftest import make_problem

K, N, G = 64, 32, 32


@pytest.fixture
def prob(rng):
    qw, qz, sc = make_problem(rng, K, N, G)
    out = np.full((K, N), 7.0, np.float16)
    return qw, qz, sc, out


def check(exc, match, prob, **override):
    """Call with one argument overridden; assert exception, message, and out untouched."""
    qw, qz, sc, out = prob
    args = dict(qweight=qw, qzeros=qz, scales=sc, out=out)
    args.update(override)
    target = args["out"]
    before = None if target is None else np.array(target, copy=True)
    with pytest.raises(exc, match=match):
        awq.dequantize(args.pop("qweight"), args.pop("qzeros"), args.pop("scales"), **args)
    if before is not None:
        assert np.array_equal(before.view(np.uint8), np.ascontiguousarray(target).view(np.uint8)), \
            "a rejected call wrote into out"


# ---- TypeError ----

def test_not_an_array(prob):
    check(TypeError, "qweight must be a NumPy array or an object with __dlpack__", prob,
          qweight=[[1, 2], [3, 4]])


def test_scales_not_an_array(prob):
    check(TypeError, "scales must be a NumPy array", prob, scales="nope")


@pytest.mark.parametrize("bad", [np.int64, np.float32, np.int16, np.uint8])
def test_qweight_dtype(prob, bad):
    check(TypeError, r"qweight must be int32 or uint32.*got " + np.dtype(bad).name, prob,
          qweight=prob[0].astype(bad))


def test_qzeros_dtype(prob):
    check(TypeError, r"qzeros must be int32 or uint32.*got float64", prob,
          qzeros=prob[1].astype(np.float64))


@pytest.mark.parametrize("bad", [np.int32, np.float64, np.bool_])
def test_scales_dtype(prob, bad):
    finite = np.nan_to_num(prob[2].astype(np.float32), posinf=1, neginf=-1)
    check(TypeError, r"scales must be float16, bfloat16 or float32, got " + np.dtype(bad).name,
          prob, scales=finite.astype(bad))


def test_out_wrong_dtype(prob):
    out = np.full((K, N), 3.0, np.float32)
    check(TypeError, r"out must have dtype float16.*got float32", prob, out=out)


def test_out_wrong_dtype_vs_out_dtype(prob):
    check(TypeError, r"out must have dtype bfloat16 \(out_dtype\), got float16", prob,
          out_dtype="bfloat16")


def test_bad_out_dtype(prob):
    check(TypeError, r"out_dtype must be float16, bfloat16 or float32", prob, out=None,
          out_dtype="int8")


def test_unknown_keyword(prob):
    qw, qz, sc, out = prob
    with pytest.raises(TypeError, match="groupsize"):
        awq.dequantize(qw, qz, sc, out=out, groupsize=32)
    assert (out == 7.0).all()


def test_group_size_type(prob):
    check(TypeError, "group_size must be an int", prob, group_size=32.0)


def test_stream_type(prob):
    check(TypeError, "stream must be an int handle or an object with .cuda_stream", prob,
          stream="s")


# ---- ValueError ----

@pytest.mark.parametrize("arg", ["qweight", "qzeros", "scales"])
def test_not_2d(prob, arg):
    qw, qz, sc, _ = prob
    arr = dict(qweight=qw, qzeros=qz, scales=sc)[arg]
    check(ValueError, f"{arg} must be a 2-D array, got 1 dimension", prob, **{arg: arr.ravel()})


def test_out_not_2d(prob):
    check(ValueError, "out must be a 2-D array, got 3 dimensions", prob,
          out=np.full((K, N, 1), 7.0, np.float16))


def test_qzeros_rows_vs_scales(prob):
    check(ValueError, "qzeros and scales must have the same number of rows", prob,
          qzeros=np.concatenate([prob[1], prob[1]]))


def test_scales_columns(prob):
    check(ValueError, r"scales must have 32 columns \(8 x qweight's 4 packed columns\), got 24",
          prob, scales=prob[2][:, :24].copy())


def test_qzeros_columns(prob):
    check(ValueError, "qzeros must have 4 columns like qweight", prob,
          qzeros=prob[1][:, :3].copy())


def test_group_size_not_dividing_k(prob):
    check(ValueError, "group_size 24 does not divide K = 64", prob, group_size=24)


def test_group_size_vs_rows(prob):
    check(ValueError, "group_size 16 gives K/group_size = 4 groups, but scales and qzeros have 2",
          prob, group_size=16)


def test_group_size_nonpositive(prob):
    check(ValueError, "group_size must be positive", prob, group_size=0)


def test_rows_not_dividing_k(rng):
    qw, qz, sc = make_problem(rng, 60, 16, 20)  # 3 groups of 20
    qz2, sc2 = qz[:2].copy(), sc[:2].copy()  # 2 groups: 60 / 2 = 30 would do...
    qw7 = qw[:7].copy()  # ...but K = 7 is not a multiple of 2
    out = np.full((7, 16), 7.0, np.float16)
    with pytest.raises(ValueError, match="scales and qzeros have 2 rows, which does not divide K = 7"):
        awq.dequantize(qw7, qz2, sc2, out=out)
    assert (out == 7.0).all()


def test_out_shape(prob):
    check(ValueError, r"out must have shape \(64, 32\), got \(64, 24\)", prob,
          out=np.full((K, 24), 7.0, np.float16))


@pytest.mark.parametrize("arg", ["qweight", "qzeros", "scales"])
def test_non_contiguous_input(prob, arg):
    qw, qz, sc, _ = prob
    arr = dict(qweight=qw, qzeros=qz, scales=sc)[arg]
    wide = np.repeat(arr, 2, axis=1)[:, ::2]  # same values, strided view
    check(ValueError, f"{arg} is not C-contiguous; pass {arg}.contiguous", prob, **{arg: wide})


def test_non_contiguous_out(prob):
    big = np.full((K, 2 * N), 7.0, np.float16)
    check(ValueError, "out is not C-contiguous", prob, out=big[:, ::2])
    assert (big == 7.0).all()


def test_read_only_out(prob):
    out = np.full((K, N), 7.0, np.float16)
    out.setflags(write=False)
    check(ValueError, "out is read-only", prob, out=out)


@pytest.mark.parametrize("arg", ["qweight", "scales"])
def test_out_overlaps_input(rng, arg):
    # out's memory shared with an input: reject, write nothing
    buf = np.full(K * N // 2 + K * N // 8 + 64, 0x07070707, np.uint32)
    out = buf[: K * N // 2].view(np.float16).reshape(K, N)
    qw, qz, sc = make_problem(rng, K, N, G)
    if arg == "qweight":
        qw = buf[K * N // 2 - 8: K * N // 2 - 8 + K * N // 8].reshape(K, N // 8)
    else:
        sc = buf[: (K // G) * N // 2].view(np.float16).reshape(K // G, N)
    snapshot = buf.copy()
    with pytest.raises(ValueError, match=f"out overlaps {arg}"):
        awq.dequantize(qw, qz, sc, out=out)
    assert np.array_equal(buf, snapshot)


def test_misaligned_input(prob):
    raw = np.zeros(prob[0].nbytes + 1, np.uint8)
    mis = np.frombuffer(raw.data, dtype=np.int32, count=prob[0].size, offset=1)
    mis = mis.reshape(prob[0].shape)
    check(ValueError, "qweight's data pointer is not aligned", prob, qweight=mis)


@pytest.mark.parametrize("kernel", ["v5", "V4", "", "gpu"])
def test_bad_kernel_name(prob, kernel):
    check(ValueError, "kernel must be one of", prob, kernel=kernel)


@pytest.mark.parametrize("kernel", ["v1", "v2", "v3", "v4"])
def test_cuda_kernel_on_cpu_arrays(prob, kernel):
    check(ValueError, f"kernel '{kernel}' runs on CUDA tensors", prob, kernel=kernel)


@pytest.mark.parametrize("bs", [0, 48, 2048, -32])
def test_bad_block_size_on_cpu(prob, bs):
    check(ValueError, "block_size applies to the CUDA kernels", prob, block_size=bs)


def test_negative_stream(prob):
    check(ValueError, "stream must be a non-negative handle", prob, stream=-5)


# ---- RuntimeError ----

@pytest.mark.skipif(awq.build_info()["cuda"], reason="this build has CUDA")
def test_cuda_input_to_cpu_only_build():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA tensor (a GPU machine with a CPU-only build)")
    qw = torch.zeros((32, 4), dtype=torch.int32, device="cuda")
    with pytest.raises(RuntimeError, match="built without CUDA.*Rebuild"):
        awq.dequantize(qw, qw[:1], torch.zeros((1, 32), dtype=torch.float16, device="cuda"))

