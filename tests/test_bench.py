"""The benchmark harness on the CPU: JSON contents, randomized order,
bit-exactness failures and the exit code, plots, the command lines, and
the Nsight Compute table parser. Tiny shapes: these check the harness,
never timings."""

import json
import subprocess
import sys

import numpy as np
import pytest

import awq_fast_dequant as awq
from awq_fast_dequant import bench
from awq_fast_dequant._bench_impls import INJECT_ENV

from conftest import child_env

# A tiny layer, a small cache-flush buffer, no progress bar: each run well under a second.
FAST = ["--device", "cpu", "--shapes", "64x64", "--group", "32", "--flush-mib", "4",
        "--no-progress"]


def run_bench(tmp_path, *extra, name="out.json"):
    path = tmp_path / name
    code = bench.main(FAST + ["--json", str(path), *extra])
    with open(path, encoding="utf-8") as f:
        return code, json.load(f)


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AWQ_FAST_DEQUANT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(INJECT_ENV, raising=False)


def test_bytes_moved_is_the_roofline_formula():
    # K*N/2 + 4*(K/G)*(N/8) + s*(K/G)*N + o*K*N
    assert bench.bytes_moved(4096, 14336, 128, "float16") == (
        4096 * 14336 // 2 + 4 * 32 * 1792 + 2 * 32 * 14336 + 2 * 4096 * 14336)
    assert bench.bytes_moved(256, 64, 64, "float32") == 256 * 32 + 4 * 4 * 8 + 4 * 4 * 64 + 4 * 256 * 64


def test_presets_are_the_nine_design_shapes():
    shapes = bench._parse_shapes("qwen2.5-1.5b,llama-3-8b,llama-3-70b", 128)
    assert [(s.K, s.N) for s in shapes] == [
        (1536, 1536), (1536, 8960), (8960, 1536),
        (4096, 4096), (4096, 14336), (14336, 4096),
        (8192, 8192), (8192, 28672), (28672, 8192)]
    assert [s.G for s in bench._parse_shapes("256x64:32,all", 128)][:2] == [32, 128]


def test_cpu_run_writes_json_with_the_documented_fields(tmp_path):
    code, out = run_bench(tmp_path, "--trials", "2", "--runs", "2")
    assert code == 0
    for key in ("schema", "complete", "argv", "config", "environment", "peers",
                "copy_bandwidth", "launch_floor", "shapes", "host_overhead", "plots", "summary"):
        assert key in out, key
    assert out["complete"] is True
    assert out["launch_floor"] is None  # CUDA only
    assert out["summary"]["exit_code"] == 0 and out["summary"]["all_ours_bitexact"] is True
    cfg = out["config"]
    assert cfg["device"] == "cpu" and cfg["trials"] == 2 and cfg["runs"] == 2
    assert cfg["kernels"] == ["cpu", "smart", "numpy"]
    env = out["environment"]
    for key in ("hostname", "date", "python", "versions", "build_info", "git"):
        assert key in env, key
    assert env["versions"]["awq_fast_dequant"] == awq.__version__
    assert env["versions"]["numpy"] == np.__version__
    assert "commit" in env["git"]  # a hex string in a checkout, else None

    (shape,) = out["shapes"]
    assert (shape["K"], shape["N"], shape["G"]) == (64, 64, 32)
    assert shape["bytes"] == bench.bytes_moved(64, 64, 32, "float16")
    assert shape["copy_gbps"] > 0
    assert len(shape["orders"]) == 2
    assert set(shape["implementations"]) == {"cpu", "smart", "numpy"}
    for name, rec in shape["implementations"].items():
        assert rec["error"] is None, (name, rec["error"])
        assert rec["bitexact"] is True
        assert rec["ours"] is True
        assert rec["mismatches"] == [0, 0]
        # every raw timing: trials x runs microseconds
        assert len(rec["samples_us"]) == 2 and all(len(t) == 2 for t in rec["samples_us"])
        stats = rec["stats"]
        assert stats["n"] == 4
        assert stats["median_us"] > 0 and stats["mean_us"] > 0
        assert isinstance(stats["unstable"], bool)
        assert rec["gbps"] == pytest.approx(shape["bytes"] / (stats["median_us"] * 1e3))
        assert rec["pct_copy"] == pytest.approx(100 * rec["gbps"] / shape["copy_gbps"])
    assert shape["implementations"]["numpy"]["role"] == "baseline"


def test_order_is_randomized_across_trials(tmp_path):
    code, out = run_bench(tmp_path, "--trials", "8", "--runs", "1")
    assert code == 0
    orders = out["shapes"][0]["orders"]
    assert len(orders) == 8
    names = sorted(out["shapes"][0]["implementations"])
    assert len(names) >= 3
    assert all(sorted(o) == names for o in orders)  # each trial runs every one once
    assert len({tuple(o) for o in orders}) > 1


def test_injected_wrong_implementation_fails_the_run(tmp_path, monkeypatch):
    monkeypatch.setenv(INJECT_ENV, "off_by_one")
    code, out = run_bench(tmp_path, "--trials", "2", "--runs", "1")
    assert code == 1
    recs = out["shapes"][0]["implementations"]
    wrong = recs["off_by_one"]
    assert wrong["ours"] is True and wrong["bitexact"] is False
    assert wrong["mismatches"] == [1, 1]  # one element, one ulp, every trial
    assert all(recs[n]["bitexact"] is True for n in ("cpu", "smart", "numpy"))
    assert out["summary"]["exit_code"] == 1
    assert out["summary"]["all_ours_bitexact"] is False
    assert any("off_by_one" in f for f in out["summary"]["ours_not_bitexact"])


def test_register_impl_ours_fails_and_a_peer_only_reports(tmp_path):
    def plus_one_ulp(case):
        result = awq.dequantize(case.qweight, case.qzeros, case.scales,
                                group_size=case.group_size, kernel="cpu")
        result.view(np.uint16)[3, 5] += 1
        return result

    bench.register_impl("peer_like", plus_one_ulp, ours=False)
    try:
        code, out = run_bench(tmp_path, "--trials", "2", "--runs", "1", name="peer.json")
        assert code == 0  # a peer that differs is reported, not failed
        rec = out["shapes"][0]["implementations"]["peer_like"]
        assert rec["bitexact"] is False and rec["ours"] is False
        assert out["summary"]["peers_not_bitexact"] == ["peer_like"]

        bench.register_impl("peer_like", plus_one_ulp)  # now held to the contract
        code, out = run_bench(tmp_path, "--trials", "2", "--runs", "1", name="ours.json")
        assert code == 1
    finally:
        bench.unregister_impl("peer_like")


def test_torch_baseline_is_bitexact_on_the_cpu(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("ml_dtypes")
    for dtype in ("bfloat16", "float32"):
        code, out = run_bench(tmp_path, "--trials", "1", "--runs", "1", "--dtype", dtype,
                              "--kernels", "cpu,torch,numpy", name=f"{dtype}.json")
        assert code == 0, out["summary"]
        assert out["shapes"][0]["implementations"]["torch"]["bitexact"] is True


def test_plot_writes_pngs(tmp_path):
    pytest.importorskip("matplotlib")
    prefix = tmp_path / "plots" / "cpu"
    code, out = run_bench(tmp_path, "--trials", "2", "--runs", "1", "--plot", str(prefix))
    assert code == 0
    assert out["plots"] == [str(prefix) + "_gbps.png"]  # host and prefill are CUDA only
    with open(out["plots"][0], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_bad_arguments_exit_2(capsys):
    assert bench.main(["--device", "cpu", "--kernels", "v9"]) == 2
    assert bench.main(["--device", "cpu", "--shapes", "100x64"]) == 2  # G=128 does not divide 100
    assert bench.main(["--device", "cpu", "--shapes", "64x60:32"]) == 2  # N not a multiple of 8
    assert "v9" in capsys.readouterr().err


def _subprocess_env(tmp_path):
    env = child_env(AWQ_FAST_DEQUANT_CACHE_DIR=str(tmp_path / "cache"))
    env.pop(INJECT_ENV, None)
    return env


@pytest.mark.parametrize("module", [["awq_fast_dequant", "bench"], ["awq_fast_dequant.bench"]])
def test_command_line(tmp_path, module):
    path = tmp_path / "cli.json"
    proc = subprocess.run(
        [sys.executable, "-m", *module, *FAST, "--trials", "2", "--runs", "2", "--json", str(path)],
        cwd=tmp_path, env=_subprocess_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "bit-exact" in proc.stdout  # the table
    with open(path, encoding="utf-8") as f:
        out = json.load(f)
    assert out["summary"]["exit_code"] == 0


def test_command_line_exit_code_with_injection(tmp_path):
    env = _subprocess_env(tmp_path)
    env[INJECT_ENV] = "wrong"
    proc = subprocess.run(
        [sys.executable, "-m", "awq_fast_dequant.bench", *FAST, "--trials", "1", "--runs", "1"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "NOT bit-exact" in proc.stdout


NCU_CSV = '''==PROF== Connected to process 1234
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","dram__bytes_read.sum","dram__bytes_write.sum","dram__throughput.avg.pct_of_peak_sustained_elapsed","gpu__time_duration.sum","l1tex__throughput.avg.pct_of_peak_sustained_active","launch__block_size","launch__grid_size","launch__registers_per_thread","sm__maximum_warps_per_active_cycle_pct","sm__warps_active.avg.pct_of_peak_sustained_active"
"","","","","","","","","","","","byte","byte","%","nsecond","%","","","register/thread","%","%"
"0","1234","python3","h","void awq_v1_kernel<__half, __half>(SimpleArgs)","1","7","(256, 1, 1)","(229376, 1, 1)","0","9.0","33,554,432","117,440,512","61.5","52,000","40.1","256","229,376","18","100","88.2"
"1","1234","python3","h","awq_v4_kernel<__half, __half, 8, true>","1","7","(256, 1, 1)","(896, 1, 1)","0","9.0","33554432","117440512","91.25","34500","22.0","256","896","40","75","61.9"
'''


def test_ncu_table_parser(tmp_path, capsys):
    path = tmp_path / "raw.csv"
    path.write_text(NCU_CSV)
    code = bench.main(["--ncu-table", str(path), "--kernels", "v1,v4", "--json",
                       str(tmp_path / "ncu.json")])
    assert code == 0
    text = capsys.readouterr().out
    assert "DRAM %" in text and "regs/thread" in text
    with open(tmp_path / "ncu.json", encoding="utf-8") as f:
        kernels = json.load(f)["kernels"]
    assert [k["label"] for k in kernels] == ["v1", "v4"]
    v1 = kernels[0]["values"]
    assert v1["dram__throughput.avg.pct_of_peak_sustained_elapsed"] == 61.5
    assert v1["launch__registers_per_thread"] == 18
    assert v1["dram__bytes_read.sum"] == 33554432
    assert "52.0 us" in text
