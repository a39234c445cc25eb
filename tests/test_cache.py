"""smart_dequantize and its autotune cache (DESIGN.md section 5)."""

import os
import shutil
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import awq_fast_dequant as awq
from awq_fast_dequant import _C, reference

from conftest import DTYPES, SWEEP_KG, SWEEP_N, child_env, make_problem, run_threads

HEADER = "# awq_fast_dequant autotune cache v3\n"
CPU_GEN = awq.build_info()["kernel_generations"]["cpu"]


def _run_py(code, cache, extra_env=None):
    env = child_env(AWQ_FAST_DEQUANT_CACHE_DIR=str(cache), PYTHONWARNINGS="default",
                    **(extra_env or {}))
    # cwd: away from a source checkout, whose package folder would shadow the installed one
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=cache,
                          capture_output=True, text=True, timeout=120)


# ---- the C hash table ----

def test_table_insert_update_absent():
    r = _C._dev.table_test([
        ("get", "dev", 64, 64, 32),
        ("put", "dev", 64, 64, 32, 128),
        ("get", "dev", 64, 64, 32),
        ("put", "dev", 64, 64, 32, 256),  # update
        ("get", "dev", 64, 64, 32),
        ("get", "dev", 64, 64, 64),  # differs in G only
        ("get", "other", 64, 64, 32),  # differs in device only
        ("size",),
    ])
    assert r == [None, 0, 128, 0, 256, None, None, 1]


def test_table_growth_keeps_every_entry():
    n = 6000
    ops = [("put", f"gpu{i % 7}", 8 * (i + 1), 8 * (i % 13 + 1), 8, 32 * (i % 32 + 1))
           for i in range(n)]
    ops += [("get", f"gpu{i % 7}", 8 * (i + 1), 8 * (i % 13 + 1), 8) for i in range(n)]
    ops += [("get", "gpu0", 8 * (n + 5), 8, 8), ("size",)]
    r = _C._dev.table_test(ops)
    assert r[:n] == [0] * n
    assert r[n:2 * n] == [32 * (i % 32 + 1) for i in range(n)]
    assert r[2 * n:] == [None, n]


def test_c_unit_tests_pass():
    """The standalone C test of csrc/autotune/ (ASan + UBSan), where a compiler exists."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not shutil.which("make") or not shutil.which(os.environ.get("CC", "gcc")):
        pytest.skip("no make / C compiler")
    if not os.path.exists(os.path.join(root, "csrc", "autotune", "table.c")):
        pytest.skip("sources not available (installed package only)")
    r = subprocess.run(["make", "-s", "-C", os.path.join(root, "tests", "c")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


# ---- smart_dequantize on the CPU ----

@pytest.mark.parametrize("scale_dtype", DTYPES)
def test_smart_matches_dequantize(cache_dir, rng, scale_dtype):
    """Every case of the CPU correctness sweep (tests/test_dequantize_cpu.py)."""
    for K, G in SWEEP_KG:
        for N in SWEEP_N:
            qw, qz, sc = make_problem(rng, K, N, G, scale_dtype)
            for out_dtype in DTYPES:
                a = awq.smart_dequantize(qw, qz, sc, out_dtype=out_dtype)
                b = awq.smart_dequantize(qw, qz, sc, out_dtype=out_dtype)  # the cached path
                expect = awq.dequantize(qw, qz, sc, out_dtype=out_dtype)
                reference.assert_bitexact(a, expect)
                reference.assert_bitexact(b, expect)
                reference.assert_bitexact(b, reference.dequantize(qw, qz, sc, out_dtype=out_dtype))


def test_first_call_tunes_then_hits(cache_dir, rng):
    qw, qz, sc = make_problem(rng, 256, 512, 128)
    out = np.empty((256, 512), np.float16)
    awq.smart_dequantize(qw, qz, sc, out=out)
    s1 = awq.cache_stats()
    assert (s1["misses"], s1["tunings"], s1["hits"]) == (1, 1, 0)
    for _ in range(5):
        awq.smart_dequantize(qw, qz, sc, out=out)
    s2 = awq.cache_stats()
    assert (s2["misses"], s2["tunings"], s2["hits"]) == (1, 1, 5)
    (entry,) = awq.cache_entries()
    assert entry["K"] == 256 and entry["N"] == 512 and entry["G"] == 128
    assert entry["scales_dtype"] == entry["out_dtype"] == "float16"
    assert entry["kernel"] == "cpu" and entry["us"] > 0 and entry["device"].startswith("cpu ")
    info = awq.build_info()
    simd = entry["device"].split()[2]  # "cpu <machine> <simd>[+amx] <threads>t"
    assert simd == info["cpu_simd"] + ("+amx" if info["cpu_amx"] else "")
    assert entry["gen"] == CPU_GEN
    text = (cache_dir / "autotune.txt").read_text()
    assert text.startswith(HEADER)
    assert f"\t{CPU_GEN}\tdequantize\t256\t512\t128\t0\tfloat16\tfloat16\tcpu\t" in text
    assert awq.cache_path() == str(cache_dir / "autotune.txt")


def test_autotune_disabled(cache_dir, rng, monkeypatch):
    monkeypatch.setenv("AWQ_FAST_DEQUANT_AUTOTUNE", "0")
    _C._dev.cache_reload()  # the setting is read at first use
    qw, qz, sc = make_problem(rng, 64, 64, 32)
    reference.assert_bitexact(awq.smart_dequantize(qw, qz, sc), reference.dequantize(qw, qz, sc))
    assert awq.cache_stats()["tunings"] == 0 and awq.cache_entries() == []
    assert not (cache_dir / "autotune.txt").exists()


def test_clear_cache(cache_dir, rng):
    qw, qz, sc = make_problem(rng, 64, 64, 32)
    awq.smart_dequantize(qw, qz, sc)
    assert (cache_dir / "autotune.txt").exists() and len(awq.cache_entries()) == 1
    awq.clear_cache()
    assert awq.cache_entries() == [] and not (cache_dir / "autotune.txt").exists()


def test_round_trip_across_processes(tmp_path):
    code = """
        import numpy as np, awq_fast_dequant as awq
        rng = np.random.default_rng(0)
        qw = rng.integers(0, 2**32, (256, 64), dtype=np.uint32)
        qz = rng.integers(0, 2**32, (2, 64), dtype=np.uint32)
        sc = rng.standard_normal((2, 512)).astype(np.float16)
        awq.smart_dequantize(qw, qz, sc)
        s = awq.cache_stats()
        print(s["hits"], s["misses"], s["tunings"])
    """
    first = _run_py(code, tmp_path)
    second = _run_py(code, tmp_path)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert first.stdout.split() == ["0", "1", "1"]
    assert second.stdout.split() == ["1", "0", "0"]  # a hit, no tuning


def test_four_processes_tune_different_shapes_at_once(tmp_path):
    code = """
        import sys, numpy as np, awq_fast_dequant as awq
        N = int(sys.argv[1])
        rng = np.random.default_rng(N)
        qw = rng.integers(0, 2**32, (128, N // 8), dtype=np.uint32)
        qz = rng.integers(0, 2**32, (1, N // 8), dtype=np.uint32)
        sc = rng.standard_normal((1, N)).astype(np.float16)
        awq.smart_dequantize(qw, qz, sc)
    """
    env = child_env(AWQ_FAST_DEQUANT_CACHE_DIR=str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), str(n)], env=env,
                              cwd=tmp_path)
             for n in (64, 128, 256, 512)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    lines = [l for l in (tmp_path / "autotune.txt").read_text().splitlines()
             if l and not l.startswith("#")]
    assert sorted(int(l.split("\t")[4]) for l in lines) == [64, 128, 256, 512]  # N


def test_eight_threads_same_new_shape(cache_dir, rng):
    qw, qz, sc = make_problem(rng, 512, 1024, 128)
    expect = reference.dequantize(qw, qz, sc)
    results = [None] * 8

    def worker(i):
        results[i] = awq.smart_dequantize(qw, qz, sc)

    errors = run_threads(8, worker)
    assert not errors
    for r in results:
        reference.assert_bitexact(r, expect)
    assert len(awq.cache_entries()) == 1


# ---- a damaged cache is never an error ----

GOOD = (f"cpu x86_64 avx2+f16c 2t\t{CPU_GEN}\tdequantize\t64\t64\t32\t0\tfloat16\tfloat16\tcpu"
        "\t0\t0\t0\t1\t8\t12.5\n")

DAMAGED = {
    "empty": "",
    "truncated": HEADER + GOOD + GOOD.replace("\t64\t64", "\t128\t64")[:20],
    "garbage": "\x00\xff\x13binary\x00garbage\n" * 10,
    "future_version": "# awq_fast_dequant autotune cache v99\n" + GOOD,
    "bad_lines": HEADER + "not\ta\tvalid\tline\n" + GOOD + "x" * 5000 + "\n",
}


@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_damaged_file_warns_and_still_works(cache_dir, rng, case):
    cache_dir.mkdir()
    (cache_dir / "autotune.txt").write_bytes(DAMAGED[case].encode("latin-1"))
    qw, qz, sc = make_problem(rng, 64, 64, 32)
    with pytest.warns(RuntimeWarning, match="autotune cache"):
        got = awq.smart_dequantize(qw, qz, sc)
    reference.assert_bitexact(got, reference.dequantize(qw, qz, sc))
    if case in ("truncated", "bad_lines"):
        # the valid line of a partly damaged file is kept (here: the 64x64 key)
        assert any(e["K"] == 64 and e["N"] == 64 for e in awq.cache_entries())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: no second warning for the same problem
        awq.smart_dequantize(qw, qz, sc)


def test_future_version_file_is_not_overwritten(cache_dir, rng):
    cache_dir.mkdir()
    path = cache_dir / "autotune.txt"
    path.write_text(DAMAGED["future_version"])
    qw, qz, sc = make_problem(rng, 64, 128, 32)
    with pytest.warns(RuntimeWarning):
        awq.smart_dequantize(qw, qz, sc)
    assert path.read_text() == DAMAGED["future_version"]


def _tuned_fields(cache_dir, qw, qz, sc):
    """The file line this build writes when it tunes these arrays, split in
    fields; the cache is emptied again afterwards."""
    awq.smart_dequantize(qw, qz, sc)
    lines = (cache_dir / "autotune.txt").read_text().splitlines()
    (line,) = [ln for ln in lines if not ln.startswith("#")]
    awq.clear_cache()
    _C._dev.cache_reload()
    return line.split("\t")


def test_entries_of_other_kernel_generations_are_kept_not_used(cache_dir, rng):
    """A pick tuned for other kernels (another generation) is never used, and
    stays in the file for the build that tuned it."""
    qw, qz, sc = make_problem(rng, 128, 64, 32)
    fields = _tuned_fields(cache_dir, qw, qz, sc)
    assert fields[1] == str(CPU_GEN)
    other = fields[:]
    other[1] = str(CPU_GEN + 1)
    other[-1] = "0.001"  # an entry this build would otherwise take as is
    cache_dir.mkdir(exist_ok=True)
    (cache_dir / "autotune.txt").write_text(HEADER + "\t".join(other) + "\n")
    got = awq.smart_dequantize(qw, qz, sc)
    reference.assert_bitexact(got, reference.dequantize(qw, qz, sc))
    stats = awq.cache_stats()
    assert (stats["misses"], stats["tunings"], stats["hits"]) == (1, 1, 0)
    gens = sorted(e["gen"] for e in awq.cache_entries())
    assert gens == [CPU_GEN, CPU_GEN + 1]
    text = (cache_dir / "autotune.txt").read_text()
    assert "\t".join(other) + "\n" in text  # the other generation's line, unchanged
    awq.smart_dequantize(qw, qz, sc)
    assert awq.cache_stats()["hits"] == 1


@pytest.mark.parametrize("version", [1, 2])
def test_old_format_file_is_replaced(cache_dir, rng, version):
    """A file of an older format (v1: no generation; v2: no op, M and split)
    is ignored with one warning, and the first save replaces it with the
    current format."""
    qw, qz, sc = make_problem(rng, 128, 64, 32)
    f = _tuned_fields(cache_dir, qw, qz, sc)
    # v3: device gen op K N G M scales out kernel block rows split threads chunk us
    v2 = [f[0], f[1]] + f[3:6] + f[7:12] + f[13:]
    old_line = "\t".join(v2 if version == 2 else v2[:1] + v2[2:]) + "\n"
    cache_dir.mkdir(exist_ok=True)
    path = cache_dir / "autotune.txt"
    path.write_text(f"# awq_fast_dequant autotune cache v{version}\n" + old_line)
    with pytest.warns(RuntimeWarning, match=f"format v{version}, written by an older"):
        got = awq.smart_dequantize(qw, qz, sc)
    reference.assert_bitexact(got, reference.dequantize(qw, qz, sc))
    assert awq.cache_stats()["tunings"] == 1
    text = path.read_text()
    assert text.startswith(HEADER) and old_line not in text
    assert [e["gen"] for e in awq.cache_entries()] == [CPU_GEN]


def _write_entry(cache_dir, fields, config):
    """The cache file holding one entry: `fields`' key with `config`
    (kernel, block_size, rows, split, threads, chunk) and a time of 1 us."""
    cache_dir.mkdir(exist_ok=True)
    line = fields[:9] + list(config) + ["1"]
    (cache_dir / "autotune.txt").write_text(HEADER + "\t".join(line) + "\n")
    _C._dev.cache_reload()


def test_hand_edited_cpu_entries_stay_exact(cache_dir, rng):
    """Entries no tuner writes but the format allows: parameters far out of
    range are clamped, a configuration for the GPU is a miss (tuned again)."""
    qw, qz, sc = make_problem(rng, 256, 64, 32)
    fields = _tuned_fields(cache_dir, qw, qz, sc)
    expect = reference.dequantize(qw, qz, sc)
    cases = {"huge chunk": (("cpu", "0", "0", "0", "0", str(2**63 - 1)), 0),
             "many threads": (("cpu", "0", "0", "0", "65536", "1"), 0),
             "a GPU config": (("v4", "256", "2", "0", "0", "0"), 1)}
    for name, (config, tunings) in cases.items():
        _write_entry(cache_dir, fields, config)
        reference.assert_bitexact(awq.smart_dequantize(qw, qz, sc), expect)
        assert awq.cache_stats()["tunings"] == tunings, name


def test_unwritable_folder(tmp_path, monkeypatch, rng):
    """A folder that cannot be created (a file stands in its path; works as root too)."""
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("AWQ_FAST_DEQUANT_CACHE_DIR", str(blocker / "cache"))
    _C._dev.cache_reload()
    try:
        qw, qz, sc = make_problem(rng, 64, 64, 32)
        with pytest.warns(RuntimeWarning, match="autotune cache"):
            got = awq.smart_dequantize(qw, qz, sc)
        reference.assert_bitexact(got, reference.dequantize(qw, qz, sc))
        awq.smart_dequantize(qw, qz, sc)
        assert awq.cache_stats()["hits"] == 1  # kept in memory
    finally:
        _C._dev.cache_reload()


def test_unreadable_file(cache_dir, rng):
    """The cache path is a folder: it cannot be read as a file."""
    (cache_dir / "autotune.txt").mkdir(parents=True)
    qw, qz, sc = make_problem(rng, 64, 64, 32)
    with pytest.warns(RuntimeWarning, match="autotune cache"):
        got = awq.smart_dequantize(qw, qz, sc)
    reference.assert_bitexact(got, reference.dequantize(qw, qz, sc))


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root ignores file permissions")
def test_read_only_folder(cache_dir, rng):
    cache_dir.mkdir()
    cache_dir.chmod(0o555)
    try:
        qw, qz, sc = make_problem(rng, 64, 64, 32)
        with pytest.warns(RuntimeWarning, match="autotune cache"):
            got = awq.smart_dequantize(qw, qz, sc)
        reference.assert_bitexact(got, reference.dequantize(qw, qz, sc))
    finally:
        cache_dir.chmod(0o755)


# ---- GPU ----

@pytest.mark.gpu
@pytest.mark.skipif(not awq.cuda_available(), reason="needs a CUDA GPU")
def test_smart_on_cuda(cache_dir, rng):
    """Every case of the correctness sweep, on the GPU: tuned == reference."""
    torch = pytest.importorskip("torch")
    shapes = [(K, N, G) for K, G in SWEEP_KG for N in SWEEP_N]
    for K, N, G in shapes:
        qw, qz, sc = make_problem(rng, K, N, G, "float32")
        for sdt in DTYPES:
            t = (torch.from_numpy(qw).cuda(), torch.from_numpy(qz).cuda(),
                 torch.from_numpy(sc).to("cuda", getattr(torch, sdt)))
            for odt in DTYPES:
                a = awq.smart_dequantize(*t, out_dtype=odt)
                b = awq.smart_dequantize(*t, out_dtype=odt)
                torch.cuda.synchronize()
                expect = reference.dequantize(*t, out_dtype=odt)
                reference.assert_bitexact(a, expect)
                reference.assert_bitexact(b, expect)
    entries = [e for e in awq.cache_entries() if not e["device"].startswith("cpu")]
    assert len(entries) == len(shapes) * 9 and all(e["kernel"] in ("v3", "v4") for e in entries)
    cuda_gen = awq.build_info()["kernel_generations"]["cuda"]
    assert all(e["gen"] == cuda_gen for e in entries)


@pytest.mark.gpu
@pytest.mark.skipif(not awq.cuda_available(), reason="needs a CUDA GPU")
def test_no_tuning_during_graph_capture(cache_dir, rng):
    torch = pytest.importorskip("torch")
    qw, qz, sc = make_problem(rng, 512, 1024, 128, specials=False)
    t = [torch.from_numpy(a).cuda() for a in (qw, qz, sc)]
    out = torch.empty((512, 1024), dtype=torch.float16, device="cuda")
    awq.dequantize(*t, out=out)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.graph(g, stream=s):
        awq.smart_dequantize(*t, out=out)
    assert awq.cache_stats()["tunings"] == 0 and awq.cache_entries() == []
    out.zero_()
    g.replay()
    torch.cuda.synchronize()
    reference.assert_bitexact(out, reference.dequantize(qw, qz, sc))


@pytest.mark.gpu
@pytest.mark.skipif(not awq.cuda_available(), reason="needs a CUDA GPU")
def test_hand_edited_cuda_entries_never_fail(cache_dir, rng):
    """A CPU configuration under a GPU key is a miss (tuned again); rows that
    v4 does not take make the line malformed (one warning, tuned again)."""
    torch = pytest.importorskip("torch")
    qw, qz, sc = make_problem(rng, 256, 512, 128)
    t = [torch.from_numpy(a).cuda() for a in (qw, qz, sc)]
    expect = reference.dequantize(qw, qz, sc)
    fields = _tuned_fields(cache_dir, *t)
    assert not fields[0].startswith("cpu")
    _write_entry(cache_dir, fields, ("cpu", "0", "0", "2", "8"))
    reference.assert_bitexact(awq.smart_dequantize(*t), expect)
    assert awq.cache_stats()["tunings"] == 1
    _write_entry(cache_dir, fields, ("v4", "64", "3", "0", "0"))
    with pytest.warns(RuntimeWarning, match="malformed"):
        got = awq.smart_dequantize(*t)
    reference.assert_bitexact(got, expect)
    assert awq.cache_stats()["tunings"] == 1
