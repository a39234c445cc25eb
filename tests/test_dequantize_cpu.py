"""The CPU backend against the NumPy reference, bit for bit."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import awq_fast_dequant as awq
from awq_fast_dequant import reference

from conftest import DTYPES, SWEEP_KG, SWEEP_N, child_env, make_problem, np_dtype

PAIRS = [(s, o) for s in DTYPES for o in DTYPES]


@pytest.mark.parametrize("scale_dtype,out_dtype", PAIRS)
def test_sweep_bitexact(rng, scale_dtype, out_dtype):
    for K, G in SWEEP_KG:
        for N in SWEEP_N:
            qw, qz, sc = make_problem(rng, K, N, G, scale_dtype)
            got = awq.dequantize(qw, qz, sc, out_dtype=out_dtype)
            assert got.shape == (K, N) and got.dtype == np_dtype(out_dtype)
            reference.assert_bitexact(got, reference.dequantize(qw, qz, sc, out_dtype=out_dtype))


SCALAR_SWEEP = """
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import awq_fast_dequant as awq
from awq_fast_dequant import reference
from conftest import DTYPES, SWEEP_KG, make_problem
assert awq.build_info()["cpu_simd"] == "scalar", awq.build_info()["cpu_simd"]
rng = np.random.default_rng(7)
checked = 0
for scale_dtype in DTYPES:
    for out_dtype in DTYPES:
        for K, G in SWEEP_KG:
            qw, qz, sc = make_problem(rng, K, 136, G, scale_dtype)
            got = awq.dequantize(qw, qz, sc, out_dtype=out_dtype)
            reference.assert_bitexact(got, reference.dequantize(qw, qz, sc, out_dtype=out_dtype))
            checked += 1
print(checked)
"""


def test_scalar_path_bitexact(tmp_path):
    """The portable path (taken where AVX2/F16C is missing) gives the same bits. It is
    chosen once per process, so a fresh one runs it, with AWQ_FAST_DEQUANT_CPU_SCALAR=1."""
    r = subprocess.run([sys.executable, "-c", SCALAR_SWEEP, str(Path(__file__).parent)],
                       env=child_env(AWQ_FAST_DEQUANT_CPU_SCALAR="1"), cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) == len(DTYPES) ** 2 * len(SWEEP_KG)


def _build_info_in_child(tmp_path, key, **variables):
    """build_info()[key] of a fresh process (the variables are read once per
    process) with AWQ_FAST_DEQUANT_CPU_SCALAR and AWQ_FAST_DEQUANT_NO_AMX unset,
    then the given ones (name without the prefix: value) set."""
    env = child_env()
    for name in ("CPU_SCALAR", "NO_AMX"):
        env.pop("AWQ_FAST_DEQUANT_" + name, None)
    env.update({"AWQ_FAST_DEQUANT_" + name: value for name, value in variables.items()})
    r = subprocess.run(
        [sys.executable, "-c", f"import awq_fast_dequant as a; print(a.build_info()[{key!r}])"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def _cpu_simd_in_child(tmp_path, scalar):
    """build_info()["cpu_simd"] of a fresh process with AWQ_FAST_DEQUANT_CPU_SCALAR
    unset (None) or set."""
    return _build_info_in_child(tmp_path, "cpu_simd",
                                **({} if scalar is None else {"CPU_SCALAR": scalar}))


@pytest.mark.parametrize("value,forced", [("", False), ("0", False), ("1", True), ("yes", True)])
def test_cpu_scalar_variable_forces_only_when_on(tmp_path, value, forced):
    """Empty or "0" leaves the vector path, as for the other AWQ_FAST_DEQUANT_*
    switches; any other value forces the scalar one."""
    if _cpu_simd_in_child(tmp_path, None) == "scalar":
        pytest.skip("this CPU or build has no AVX2 + F16C path")
    assert (_cpu_simd_in_child(tmp_path, value) == "scalar") == forced


@pytest.mark.parametrize("value,off", [("", False), ("0", False), ("1", True)])
def test_no_amx_variable_keeps_the_tiles_off(tmp_path, value, off):
    """AWQ_FAST_DEQUANT_NO_AMX turns the AMX kernel off, as AWQ_FAST_DEQUANT_CPU_SCALAR
    does with every vector path."""
    if _build_info_in_child(tmp_path, "cpu_amx") != "True":
        pytest.skip("this CPU or build has no AMX tiles")
    assert _build_info_in_child(tmp_path, "cpu_amx", NO_AMX=value) == str(not off)
    assert _build_info_in_child(tmp_path, "cpu_amx", CPU_SCALAR="1") == "False"


def test_every_half_scale():
    """All 65536 float16 bit patterns as scales, times every q - z in -15..15."""
    diffs = np.arange(-15, 16)
    q, z = np.maximum(diffs, 0), np.maximum(-diffs, 0)
    splat = lambda v: np.uint32(int(v) * 0x11111111)  # the nibble v in all 8 places
    halves = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    N = halves.size
    qw = np.array([[splat(v)] * (N // 8) for v in q], np.uint32)
    qz = np.array([[splat(v)] * (N // 8) for v in z], np.uint32)
    sc = np.tile(halves, (len(diffs), 1))  # group size 1: row k has its own scales
    for out_dtype in DTYPES:
        np_dtype(out_dtype)
        got = awq.dequantize(qw, qz, sc, out_dtype=out_dtype)
        reference.assert_bitexact(got, reference.dequantize(qw, qz, sc, out_dtype=out_dtype))


def test_uint32_and_int32_agree(rng):
    qw, qz, sc = make_problem(rng, 128, 64, 32, word_dtype=np.uint32)
    a = awq.dequantize(qw, qz, sc)
    b = awq.dequantize(qw.view(np.int32), qz.view(np.int32), sc)
    reference.assert_bitexact(a, b)
    reference.assert_bitexact(a, reference.dequantize(qw, qz, sc))


def test_group_size_forms(rng):
    qw, qz, sc = make_problem(rng, 128, 32, 128)
    expect = reference.dequantize(qw, qz, sc)
    for g in (None, 128, -1):
        reference.assert_bitexact(awq.dequantize(qw, qz, sc, group_size=g), expect)


@pytest.mark.parametrize("K,N", [(0, 16), (64, 0), (0, 0)])
def test_zero_size(K, N):
    qw = np.zeros((K, N // 8), np.int32)
    qz = np.zeros((K // 32 if K else 0, N // 8), np.int32)
    sc = np.zeros((qz.shape[0], N), np.float16)
    got = awq.dequantize(qw, qz, sc, group_size=32)
    assert got.shape == (K, N) and got.dtype == np.float16


def test_out_is_returned_and_written(rng):
    qw, qz, sc = make_problem(rng, 64, 24, 32)
    out = np.full((64, 24), np.nan, np.float32)
    res = awq.dequantize(qw, qz, sc, out=out, out_dtype="float32")
    assert res is out
    reference.assert_bitexact(out, reference.dequantize(qw, qz, sc, out_dtype="float32"))


@pytest.mark.parametrize("spelling", ["float32", np.float32, np.dtype("float32"), "fp32"])
def test_out_dtype_spellings(rng, spelling):
    qw, qz, sc = make_problem(rng, 32, 8, 32)
    assert awq.dequantize(qw, qz, sc, out_dtype=spelling).dtype == np.float32


def test_kernel_cpu_explicit(rng):
    qw, qz, sc = make_problem(rng, 64, 16, 32)
    reference.assert_bitexact(awq.dequantize(qw, qz, sc, kernel="cpu"),
                              reference.dequantize(qw, qz, sc))


@pytest.mark.slow
def test_more_than_2_31_elements_cpu():
    """K * N > 2^31: 64-bit index math on the host (needs ~7 GB of memory)."""
    K, N, G = 2**16 + 128, 2**15 + 8, 128
    rng = np.random.default_rng(1)
    qw, qz, sc = make_problem(rng, K, N, G, specials=False)
    out = awq.dequantize(qw, qz, sc)
    for k in (0, K // 2, K - 1):
        rows = slice(k - k % G, k - k % G + G)
        reference.assert_bitexact(out[rows], reference.dequantize(qw[rows], qz[k // G:k // G + 1],
                                                                  sc[k // G:k // G + 1]))
