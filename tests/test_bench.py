"""The benchmark harness: JSON contents, randomized order, bit-exactness
failures and the exit code, plots, the command lines, progress, the CPU
defaults, the launch floor on CUDA, and the scripts around the benchmark
(the Nsight Compute table parser). Tiny shapes: these check the harness,
never timings."""

import importlib.util
import json
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

import awq_fast_dequant as awq
from awq_fast_dequant import bench
from awq_fast_dequant.bench.cli import DEFAULTS, build_parser, resolve
from awq_fast_dequant.bench.impls import INJECT_ENV
from awq_fast_dequant.bench.shapes import PRESETS, parse_shapes

from conftest import child_env

SCRIPTS = pathlib.Path(__file__).resolve().parent.parent / "scripts"
cuda_only = pytest.mark.skipif(not awq.cuda_available(), reason="needs a CUDA GPU")

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
    shapes = parse_shapes("qwen2.5-1.5b,llama-3-8b,llama-3-70b", 128)
    assert [(s.K, s.N) for s in shapes] == [
        (1536, 1536), (1536, 8960), (8960, 1536),
        (4096, 4096), (4096, 14336), (14336, 4096),
        (8192, 8192), (8192, 28672), (28672, 8192)]
    assert [s.G for s in parse_shapes("256x64:32,all", 128)][:2] == [32, 128]


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



def test_help_states_every_default(capsys):
    assert bench.main(["--help"], prog="awq-fast-dequant bench") == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: awq-fast-dequant bench")
    options = {a.option_strings[-1]: a.help for a in build_parser()._actions
               if a.option_strings and a.option_strings[-1] != "--help"}
    assert "--device" in options and "--shapes" in options
    for option, help_text in options.items():
        assert "default" in help_text, option


def test_command_line_has_no_nsight_compute_flags(capsys):
    assert bench.main(["--ncu-table", "raw.csv"]) == 2
    assert bench.main(["--device", "cpu", "--ncu-driver"]) == 2
    assert "unrecognized arguments" in capsys.readouterr().err


def test_cpu_defaults_are_the_small_set():
    parser = build_parser()
    cfg = resolve(parser.parse_args(["--device", "cpu"]), parser)
    assert cfg.device == "cpu"
    assert [(s.K, s.N) for s in cfg.shapes] == list(PRESETS["qwen2.5-1.5b"])
    assert (cfg.trials, cfg.runs) == (DEFAULTS["cpu"]["trials"], DEFAULTS["cpu"]["runs"])
    assert (cfg.trials, cfg.runs) < (DEFAULTS["cuda"]["trials"], DEFAULTS["cuda"]["runs"])
    assert cfg.kernels == ["cpu", "smart", "numpy"]
    given = resolve(parser.parse_args(["--device", "cpu", "--trials", "3", "--runs", "2",
                                       "--shapes", "llama-3-8b"]), parser)
    assert (given.trials, given.runs) == (3, 2)
    assert [(s.K, s.N) for s in given.shapes] == list(PRESETS["llama-3-8b"])


@pytest.mark.parametrize("bad", [["--host-repeats", "0"], ["--flush-mib", "0"],
                                 ["--copy-mib", "-1"], ["--prefill-tokens", "256,x"],
                                 ["--prefill-tokens", "0"], ["--trials", "0"],
                                 ["--host-shape", "64x60"], ["--kernels", ","]])
def test_bad_numbers_exit_2_naming_the_option(capsys, bad):
    assert bench.main(["--device", "cpu", *bad]) == 2
    assert bad[0] in capsys.readouterr().err


def test_register_impl_rejects_bad_arguments():
    with pytest.raises(ValueError, match="name"):
        bench.register_impl("a,b", lambda case: None)
    with pytest.raises(ValueError, match="name"):
        bench.register_impl("", lambda case: None)
    with pytest.raises(TypeError, match="fn must be callable"):
        bench.register_impl("not_callable", 3)


def _progress_lines(text):
    return [ln for ln in text.splitlines() if ln.startswith("bench [")]


def test_progress_lines_without_tqdm(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm now raises ImportError
    args = [a for a in FAST if a != "--no-progress"]
    assert bench.main(args + ["--trials", "2", "--runs", "1"]) == 0
    lines = _progress_lines(capsys.readouterr().err)
    assert lines[0] == "bench [0/?] setting up"  # before any setup work
    # 3 implementations x 2 trials on one shape
    assert any(re.fullmatch(r"bench \[ ?0/6\] custom 64x64.*", ln) for ln in lines[1:]), lines
    assert lines[-1] == "bench [6/6] done"


def test_no_progress_prints_no_step_lines(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    assert bench.main(FAST + ["--trials", "1", "--runs", "1"]) == 0
    assert _progress_lines(capsys.readouterr().err) == []


def _load_script(name):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_scripts_reach_the_package_through_public_names_only():
    # a leading underscore marks a private name; dunders (__version__) are public, and
    # torch._C is torch's own (a probe may reach torch's experimental switches)
    private = re.compile(r"(?<!torch\.)\b_C\b|awq_fast_dequant\._(?!_)|from awq_fast_dequant\.bench\.\w+ import"
                         r"|awq\._(?!_)\w")
    scripts = sorted(SCRIPTS.glob("*.py")) + sorted(SCRIPTS.glob("*.sh"))
    assert len(scripts) >= 5
    for path in scripts:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            assert not private.search(code), f"{path.name}:{number}: {line.strip()}"
    public = set(bench.__all__)
    for path in sorted(SCRIPTS.glob("*.py")):
        for grouped, single in re.findall(r"from awq_fast_dequant\.bench import "
                                          r"(?:\(([^)]*)\)|([\w, ]+))", path.read_text()):
            used = {n.strip() for n in (grouped or single).split(",") if n.strip()}
            assert used <= public, (path.name, used - public)


NCU_CSV = '''==PROF== Connected to process 1234
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","dram__bytes_read.sum","dram__bytes_write.sum","dram__throughput.avg.pct_of_peak_sustained_elapsed","gpu__time_duration.sum","l1tex__throughput.avg.pct_of_peak_sustained_active","launch__block_size","launch__grid_size","launch__registers_per_thread","sm__maximum_warps_per_active_cycle_pct","sm__warps_active.avg.pct_of_peak_sustained_active"
"","","","","","","","","","","","byte","byte","%","nsecond","%","","","register/thread","%","%"
"0","1234","python3","h","void awq_v1_kernel<__half, __half>(SimpleArgs)","1","7","(256, 1, 1)","(229376, 1, 1)","0","9.0","33,554,432","117,440,512","61.5","52,000","40.1","256","229,376","18","100","88.2"
"1","1234","python3","h","awq_v4_kernel<__half, __half, 8, true>","1","7","(256, 1, 1)","(896, 1, 1)","0","9.0","33554432","117440512","91.25","34500","22.0","256","896","40","75","61.9"
'''


def test_ncu_table_parser(tmp_path, capsys):
    path = tmp_path / "raw.csv"
    path.write_text(NCU_CSV)
    ncu_table = _load_script("ncu_table")
    code = ncu_table.main([str(path), "--kernels", "v1,v4", "--json", str(tmp_path / "ncu.json")])
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


def test_ncu_table_without_kernel_rows_fails(tmp_path, capsys):
    path = tmp_path / "empty.csv"
    path.write_text("==PROF== nothing profiled\n")
    assert _load_script("ncu_table").main([str(path)]) == 1
    assert "no kernel rows" in capsys.readouterr().err


@pytest.mark.skipif(awq.cuda_available(), reason="needs a machine without a usable GPU")
def test_empty_launch_without_gpu_is_an_error():
    """The benchmark's floor entry on a machine with no GPU (or a CPU-only
    build) raises RuntimeError; it never crashes or launches."""
    with pytest.raises(RuntimeError, match="CUDA"):
        bench.empty_launch(0, 0)
    with pytest.raises(ValueError, match="device must be a CUDA device index"):
        bench.empty_launch(-1, 0)
    with pytest.raises(ValueError, match="stream must be a non-negative handle"):
        bench.empty_launch(0, -1)


# --------------------------------------------------------------------------
# CUDA: the launch floor and the floor model
# --------------------------------------------------------------------------


def _bench_floor(tmp_path, monkeypatch):
    monkeypatch.setenv("AWQ_FAST_DEQUANT_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "bench.json"
    code = bench.main(["--device", "cuda", "--shapes", "256x1024", "--kernels", "v4,smart",
                       "--trials", "2", "--runs", "3", "--flush-mib", "64", "--copy-mib", "64",
                       "--no-host", "--no-progress", "--json", str(path)])
    with open(path, encoding="utf-8") as f:
        return code, json.load(f)


@pytest.mark.gpu
@cuda_only
def test_bench_launch_floor_and_floor_model(tmp_path, monkeypatch):
    """The CUDA benchmark times v4 on a 1x8 layer as its launch floor, checks
    it bit for bit, and gives each layer its floor model: that time plus the
    layer's bytes at the run's copy bandwidth."""
    code, r = _bench_floor(tmp_path, monkeypatch)
    assert code == 0
    floor = r["launch_floor"]
    assert (floor["K"], floor["N"], floor["G"]) == (1, 8, 1)
    assert floor["error"] is None and floor["bitexact"] is True
    assert len(floor["samples_us"]) == 2 and all(len(t) == 3 for t in floor["samples_us"])
    assert floor["median_us"] > 0
    shape = r["shapes"][0]
    gbps = r["copy_bandwidth"]["gbps"]
    assert shape["floor_model_us"] == pytest.approx(floor["median_us"] + shape["bytes"] / (gbps * 1e3))
    for rec in shape["implementations"].values():
        assert rec["over_floor_us"] == pytest.approx(rec["stats"]["median_us"] - shape["floor_model_us"])


@pytest.mark.gpu
@cuda_only
def test_bench_fails_when_the_launch_floor_is_wrong(tmp_path, monkeypatch):
    real = awq.dequantize

    def wrong_on_one_word(qw, qz, sc, **kw):
        out = real(qw, qz, sc, **kw)
        if qw.shape[0] == 1:
            out[0, 3] += 1
        return out

    monkeypatch.setattr(awq, "dequantize", wrong_on_one_word)
    code, r = _bench_floor(tmp_path, monkeypatch)
    assert code == 1
    assert r["launch_floor"]["bitexact"] is False
    assert "launch floor: not bit-exact" in r["summary"]["failures"]
    assert r["shapes"][0]["implementations"]["v4"]["bitexact"] is True


# --------------------------------------------------------------------------
# --linear: the benchmark of linear()
# --------------------------------------------------------------------------

from awq_fast_dequant.bench import linear_check, linear_model, linear_stage  # noqa: E402
from awq_fast_dequant.bench.linear_check import (ToleranceCheck, check_rows,  # noqa: E402
                                                 numpy_reference, ulp)
from awq_fast_dequant.bench.targets import evaluate  # noqa: E402
from awq_fast_dequant.bench.verdict import finish  # noqa: E402

LINEAR_FAST = ["--linear", "--device", "cpu", "--quick", "--shapes", "64x64,128x96", "--group",
               "32", "--flush-mib", "4", "--copy-mib", "4", "--no-progress"]
LINEAR_ROWS = {"fused", "auto", "dequant+matmul", "dense"}


def run_linear(tmp_path, *extra, name="linear.json"):
    path = tmp_path / name
    code = bench.main(LINEAR_FAST + ["--json", str(path), *extra])
    with open(path, encoding="utf-8") as f:
        return code, json.load(f)


def test_linear_cpu_quick_run_end_to_end(tmp_path):
    code, out = run_linear(tmp_path)
    assert code == 0, out["summary"]
    for key in ("schema", "config", "environment", "linear", "verdict", "summary"):
        assert key in out, key
    assert out["complete"] is True and out["shapes"] == []
    cfg = out["config"]
    assert cfg["linear"] is True and cfg["quick"] is True and cfg["main"] is False
    assert cfg["linear_m"] == [1, 4] and cfg["dtypes"] == ["float16"]
    assert (cfg["trials"], cfg["runs"]) == (2, 2)
    lin = out["linear"]
    copy = lin["copy"]
    assert copy["buffer_bytes"] == 4 << 20
    assert copy["copied_gbps"] == pytest.approx(copy["buffer_bytes"] / (copy["median_us"] * 1e3))
    assert [(lay["K"], lay["N"], lay["G"], lay["dtype"]) for lay in lin["layers"]] == [
        (64, 64, 32, "float16"), (128, 96, 32, "float16")]
    for lay in lin["layers"]:
        K, N, G = lay["K"], lay["N"], lay["G"]
        assert lay["error"] is None
        assert lay["packed_bytes"] == K * N // 2 + 4 * (K // G) * (N // 8) + 2 * (K // G) * N
        assert [p["M"] for p in lay["points"]] == [1, 4]
        for p in lay["points"]:
            M = p["M"]
            assert p["bucket"] == M and p["rows_checked"] == list(range(M))
            assert p["bytes"] == lay["packed_bytes"] + 2 * M * K + 2 * M * N
            assert p["flops"] == 2 * M * K * N
            assert p["floor_model_us"] is None  # CUDA only
            assert set(p["impls"]) == LINEAR_ROWS
            assert len(p["orders"]) == 2 and all(sorted(o) == sorted(LINEAR_ROWS)
                                                 for o in p["orders"])
            choice = p["auto_choice"]
            assert choice["op"] == "linear" and choice["M"] == M
            assert choice["kernel"] in ("cpu", "amx", "dequant")
            assert (choice["K"], choice["N"]) == (K, N)
            dense_us = p["impls"]["dense"]["stats"]["median_us"]
            for name, rec in p["impls"].items():
                assert rec["error"] is None, (name, rec["error"])
                assert rec["within_tolerance"] is True and rec["outside"] == [0, 0]
                assert rec["ours"] is (name != "dense")
                assert rec["role"] == ("baseline" if name == "dense" else "ours")
                assert len(rec["samples_us"]) == 2 and all(len(t) == 2 for t in rec["samples_us"])
                us = rec["stats"]["median_us"]
                assert us > 0 and rec["x_floor"] is None
                assert rec["x_dense"] == pytest.approx(dense_us / us)
                assert rec["packed_gbps"] == pytest.approx(lay["packed_bytes"] / (us * 1e3))
                assert rec["x_copy"] == pytest.approx(rec["packed_gbps"] / copy["copied_gbps"])
                assert rec["tflops"] == pytest.approx(2 * M * K * N / (us * 1e6))
        dequant_ms = [p["M"] for p in lay["points"] if p["auto_choice"]["kernel"] == "dequant"]
        assert lay["crossover_M"] == (min(dequant_ms) if dequant_ms else None)
    verdict = out["verdict"]
    assert [t["id"] for t in verdict["targets"]] == ["cpu-m1-copy", "cpu-m1-numpy"]
    for t in verdict["targets"]:
        assert [(e["layer"], e["M"]) for e in t["evaluations"]] == [("64x64", 1), ("128x96", 1)]
        for e, lay in zip(t["evaluations"], lin["layers"]):
            figure = "x_copy" if t["id"] == "cpu-m1-copy" else "x_dense"
            assert e["value"] == lay["points"][0]["impls"]["fused"][figure]
            assert e["met"] is (e["value"] >= t["limit"])
    assert verdict["strict"] is False
    assert out["summary"]["targets_missed"] == len(verdict["missed_text"])
    assert out["summary"]["linear_outside_tolerance"] == []


@pytest.mark.parametrize("bad, says", [
    (["--dtype", "float16,bfloat16"], "--dtype: one dtype without --linear"),
    (["--quick"], "--quick applies to --linear runs only"),
    (["--strict"], "--strict applies to --linear runs only"),
    (["--linear-m", "1,2"], "--linear-m applies to --linear runs only"),
    (["--linear", "--sweep"], "--sweep does not apply to --linear"),
    (["--linear", "--kernels", "cpu"], "--kernels does not apply to --linear"),
    (["--linear", "--linear-m", "0"], "--linear-m: positive integers expected"),
    (["--linear", "--dtype", "float16,float8"], "--dtype: choose from"),
])
def test_linear_bad_arguments_exit_2(capsys, bad, says):
    assert bench.main(["--device", "cpu", *bad]) == 2
    assert says in capsys.readouterr().err


def test_linear_cpu_defaults_are_the_target_layer():
    parser = build_parser()
    cfg = resolve(parser.parse_args(["--device", "cpu", "--linear"]), parser)
    assert [(s.model, s.K, s.N, s.G) for s in cfg.shapes] == [("llama-3-8b", 4096, 14336, 128)]
    assert cfg.dtypes == ("float16", "float32") and cfg.linear_m == (1, 2, 4)
    assert cfg.main is False and cfg.copy_mib == 256
    quick = resolve(parser.parse_args(["--device", "cpu", "--linear", "--quick"]), parser)
    assert [(s.K, s.N) for s in quick.shapes] == [(1536, 1536)] and quick.linear_m == (1, 4)
    given = resolve(parser.parse_args(["--device", "cpu", "--linear", "--quick", "--linear-m",
                                       "8,2,2", "--trials", "4"]), parser)
    assert given.linear_m == (2, 8) and given.trials == 4


def test_linear_floor_model_arithmetic():
    K, N, G = 4096, 14336, 128
    packed = K * N // 2 + 4 * (K // G) * (N // 8) + 2 * (K // G) * N
    assert linear_model.packed_bytes(K, N, G, "float16") == packed
    assert linear_model.linear_bytes(1, K, N, G, "float16") == packed + 2 * K + 2 * N
    assert linear_model.linear_bytes(8, K, N, G, "float32") == (
        K * N // 2 + 4 * 32 * 1792 + 4 * 32 * N + 4 * 8 * K + 4 * 8 * N)
    assert linear_model.linear_flops(3, K, N) == 6 * K * N
    # M = 1 is bound by memory: launch floor + bytes at the copy bandwidth
    b1 = linear_model.linear_bytes(1, K, N, G, "float16")
    assert linear_model.floor_model_us(3.5, 4000.0, b1, 2 * K * N, 989e12) == pytest.approx(
        3.5 + b1 / 4e6)
    # M = 4096 is bound by arithmetic: launch floor + 2MKN at the peak
    b4k, f4k = linear_model.linear_bytes(4096, K, N, G, "float16"), 2 * 4096 * K * N
    assert linear_model.floor_model_us(3.5, 4000.0, b4k, f4k, 989e12) == pytest.approx(
        3.5 + f4k / 989e6)
    fig = linear_model.row_figures(10.0, nbytes=b1, flops=2 * K * N, floor_us=5.0, dense_us=40.0,
                                   packed=packed, copy_rate_gbps=packed / 2e4)
    assert fig["x_floor"] == pytest.approx(2.0) and fig["x_dense"] == pytest.approx(4.0)
    assert fig["gbps"] == pytest.approx(b1 / 1e4) and fig["tflops"] == pytest.approx(2 * K * N / 1e7)
    assert fig["x_copy"] == pytest.approx(2.0)
    assert linear_model.row_figures(None, nbytes=b1, flops=1)["x_dense"] is None
    assert [linear_model.m_bucket(m) for m in (1, 2, 3, 17, 4096, 4097, 10**6)] == [
        1, 2, 4, 32, 4096, 8192, 8192]


def _fake_row(us=None, ours=True, **figures):
    rec = {"ours": ours, "error": None if us else "RuntimeError: no kernel",
           "within_tolerance": True if us else None,
           "stats": {"median_us": us} if us else {"n": 0, "median_us": None}}
    return dict(rec, **figures)


def _fake_layer(model, K, N, dtype, points):
    return {"model": model, "label": f"{K}x{N}", "K": K, "N": N, "G": 128, "dtype": dtype,
            "error": None, "points": [{"M": M, "impls": impls} for M, impls in points]}


def _fake_result(layers, strict=False):
    return {"config": {"device": "cuda:0", "strict": strict}, "shapes": [], "launch_floor": None,
            "host_overhead": None, "linear": {"layers": layers}}


def _fake_run(strict=False):
    llama = _fake_layer("llama-3-8b", 4096, 4096, "float16", [
        (1, {"fused": _fake_row(5.0, x_floor=1.10, x_dense=3.5), "dense": _fake_row(17.5, False)}),
        (2, {"fused": _fake_row(6.0, x_floor=1.40, x_dense=3.1)}),  # misses <= 1.3 x floor
        (512, {"auto": _fake_row(90.0, x_dense=1.2)}),
        (4096, {"auto": _fake_row(500.0, x_dense=0.9)}),  # 11% slower than dense
    ])
    qwen = _fake_layer("qwen2.5-1.5b", 1536, 1536, "float16", [
        (1, {"fused": _fake_row(4.0, x_floor=1.25, x_dense=1.1)}),  # Qwen's limit is 1.3
        (8, {"fused": _fake_row(None)}),  # an error: its figures are not measured
    ])
    bf16 = _fake_layer("llama-3-8b", 4096, 4096, "bfloat16", [
        (1, {"fused": _fake_row(5.2, x_floor=1.14)}),  # 4% over float16
        (2, {"fused": _fake_row(6.9, x_floor=1.6)}),  # 15% over
    ])
    custom = _fake_layer("custom", 256, 512, "float16", [(1, {"fused": _fake_row(9.0, x_floor=9.0)})])
    return _fake_result([llama, qwen, bf16, custom], strict)


def test_linear_verdict_on_fabricated_numbers():
    verdict = evaluate(_fake_run())
    rules = {t["id"]: t for t in verdict["targets"]}
    assert not any(t["id"].startswith("cpu") for t in verdict["targets"])  # a CUDA run

    def status(rule):
        return [(e["layer"], e["dtype"], e["M"], e["met"]) for e in rules[rule]["evaluations"]]

    assert status("m1-floor-llama") == [("4096x4096", "float16", 1, True)]
    assert status("m1-floor-qwen") == [("1536x1536", "float16", 1, True)]
    assert status("m2-4-floor") == [("4096x4096", "float16", 2, False)]
    assert status("m1-4-dense") == [("4096x4096", "float16", 1, True), ("4096x4096", "float16", 2, True)]
    assert status("m8-16-floor") == [("1536x1536", "float16", 8, None)]  # not measured
    assert status("m256-1024-auto") == [("4096x4096", "float16", 512, True)]
    assert status("m4096-auto") == [("4096x4096", "float16", 4096, False)]
    assert rules["m4096-auto"]["evaluations"][0]["value"] == pytest.approx(1 / 0.9)
    assert status("bf16-f16") == [("4096x4096", "bfloat16", 1, True), ("4096x4096", "bfloat16", 2, False)]
    assert rules["bf16-f16"]["evaluations"][1]["value"] == pytest.approx(6.9 / 6.0)
    assert rules["m128-dense"]["evaluations"] == []  # no M = 128 in this run
    assert rules["m2-4-floor"]["worst"]["value"] == 1.40
    # the custom layer is held to no CUDA target
    assert all(e["layer"] != "256x512" for t in verdict["targets"] for e in t["evaluations"])
    assert (verdict["met"], verdict["missed"], verdict["unmeasured"]) == (6, 3, 1)
    assert len(verdict["missed_text"]) == 4
    assert any(t.startswith("m2-4-floor: llama-3-8b 4096x4096 float16 M=2") for t in verdict["missed_text"])


@pytest.mark.parametrize("strict", [False, True])
def test_linear_missed_target_fails_only_with_strict(strict):
    result = _fake_run(strict)
    result["verdict"] = evaluate(result)
    code = finish(result)
    failures = result["summary"]["failures"]
    # the fused error at M = 8 fails the run either way
    assert any("M=8: fused: RuntimeError" in f for f in failures)
    assert code == 1
    missed = [f for f in failures if f.startswith("target missed: ")]
    assert len(missed) == (4 if strict else 0)
    assert result["summary"]["targets_missed"] == 4
    # without the error, the missed targets alone decide
    del result["linear"]["layers"][1]["points"][1]
    result["verdict"] = evaluate(result)
    assert finish(result) == (1 if strict else 0)


def test_tolerance_check_counts_results_outside():
    rng = np.random.default_rng(3)
    K, N, M = 256, 64, 4
    W = (rng.standard_normal((K, N)) * 0.05).astype(np.float16)
    x = rng.standard_normal((M, K)).astype(np.float16)
    rows = np.arange(M)
    y64, bound = numpy_reference(x, W)
    assert y64 == pytest.approx(x.astype(np.float64) @ W.astype(np.float64))
    with pytest.MonkeyPatch.context() as mp:  # column chunks give the same figures
        mp.setattr(linear_check, "CHUNK_BYTES", 8 * K * 24)
        chunked = numpy_reference(x, W)
    assert chunked[0] == pytest.approx(y64, rel=1e-12, abs=1e-12)
    assert chunked[1] == pytest.approx(bound, rel=1e-12, abs=1e-12)
    check = ToleranceCheck(y64, bound, rows, M, N)
    good = (x.astype(np.float32) @ W.astype(np.float32)).astype(np.float16)
    assert check(good) == (0, None)
    tol = check.tolerance("float16")
    bad = good.copy()
    bad[2, 5] = np.float16(y64[2, 5] + 3 * tol[2, 5])
    n, note = check(bad)
    assert n == 1 and "y[2, 5]" in note
    bad[0, 0] = np.nan
    assert check(bad)[0] == 2
    swapped = good[:, [1, 0] + list(range(2, N))]
    assert check(swapped)[0] >= M  # two whole columns are wrong
    assert check(good[:3])[0] == y64.size  # wrong shape
    assert ulp(np.array([1.0, 0.0]), "float16").tolist() == [2.0**-10, 2.0**-24]
    assert ulp(np.array([1.0]), "bfloat16")[0] == 2.0**-7
    assert ulp(np.array([3.0]), "float32")[0] == 2.0**-22


def test_check_rows_are_all_up_to_16_then_8_first_and_8_random():
    assert check_rows(16, 0).tolist() == list(range(16))
    rows = check_rows(4096, 0)
    assert rows[:8].tolist() == list(range(8))
    assert len(set(rows.tolist())) == 16 and rows.min() == 0 and rows.max() < 4096
    assert rows.tolist() == check_rows(4096, 0).tolist()
    assert rows.tolist() != check_rows(4096, 1).tolist()


def test_linear_wrong_row_fails_the_run(tmp_path):
    def swapped(case):
        y = awq.linear(case.x, case.qweight, case.qzeros, case.scales, group_size=case.group_size)
        return y[:, [1, 0] + list(range(2, case.N))]

    bench.register_linear_impl("swapped", swapped, ours=False)
    try:
        code, out = run_linear(tmp_path, "--linear-m", "1,20", name="peer.json")
        assert code == 0  # a row that is not ours is reported, not failed
        p = out["linear"]["layers"][0]["points"][1]
        assert p["rows_checked"] == check_rows(20, 0).tolist()
        rec = p["impls"]["swapped"]
        assert rec["within_tolerance"] is False and rec["role"] == "registered"
        assert all(n >= 16 for n in rec["outside"]) and rec["notes"]
        bench.register_linear_impl("swapped", swapped)  # now held to the tolerance
        code, out = run_linear(tmp_path, name="ours.json")
        assert code == 1
        assert "128x96 float16 M=4: swapped" in out["summary"]["linear_outside_tolerance"]
        for lay in out["linear"]["layers"]:
            for p in lay["points"]:
                assert all(p["impls"][n]["within_tolerance"] for n in LINEAR_ROWS)
    finally:
        bench.unregister_linear_impl("swapped")


def test_linear_injected_row_fails_the_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(INJECT_ENV, "nibble_order")
    code, out = run_linear(tmp_path, "--linear-m", "2")
    assert code == 1
    assert out["config"]["registered"] == ["nibble_order"]
    rec = out["linear"]["layers"][0]["points"][0]["impls"]["nibble_order"]
    assert rec["within_tolerance"] is False and rec["ours"] is True
    assert "64x64 float16 M=2: nibble_order: outside the tolerance (worst at y[" in (
        capsys.readouterr().err)


def test_linear_torch_rows_on_cpu_tensors(tmp_path, monkeypatch):
    """The torch flavour (what CUDA runs) on CPU tensors: x and W in torch,
    the reference in float64 torch, the dense row torch.matmul, bfloat16 too."""
    torch = pytest.importorskip("torch")
    from awq_fast_dequant.bench.linear_data import TorchFlavour

    monkeypatch.setattr(linear_stage, "make_flavour", lambda ctx: TorchFlavour(torch, "cpu"))
    monkeypatch.setattr(linear_check, "CHUNK_BYTES", 8 * 64 * 24)  # the reference in 3 chunks
    code, out = run_linear(tmp_path, "--shapes", "64x64", "--linear-m", "1,20",
                           "--dtype", "float16,bfloat16")
    assert code == 0, out["summary"]
    assert out["linear"]["framework"] == "torch"
    assert [lay["dtype"] for lay in out["linear"]["layers"]] == ["float16", "bfloat16"]
    for lay in out["linear"]["layers"]:
        for p in lay["points"]:
            assert len(p["rows_checked"]) == min(p["M"], 16)
            for name, rec in p["impls"].items():
                assert rec["within_tolerance"] is True, (lay["dtype"], p["M"], name, rec["notes"])
            assert p["impls"]["fused"]["materializes_w"] is None  # measured on CUDA only


def test_linear_plot_per_layer(tmp_path):
    pytest.importorskip("matplotlib")
    prefix = tmp_path / "plots" / "cpu"
    code, out = run_linear(tmp_path, "--plot", str(prefix))
    assert code == 0
    assert out["plots"] == [f"{prefix}_linear_custom_64x64_float16.png",
                            f"{prefix}_linear_custom_128x96_float16.png"]
    for path in out["plots"]:
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_linear_progress_counts_every_trial(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    args = [a for a in LINEAR_FAST if a != "--no-progress"]
    assert bench.main(args + ["--shapes", "64x64", "--trials", "1", "--runs", "1"]) == 0
    lines = _progress_lines(capsys.readouterr().err)
    assert lines[0] == "bench [0/?] setting up"
    # 4 rows x 2 M x 1 trial on one layer
    assert any(re.fullmatch(r"bench \[0/8\] custom 64x64 float16 M=1", ln) for ln in lines), lines
    assert lines[-1] == "bench [8/8] done"


def _bench_linear_cuda(tmp_path, *extra):
    path = tmp_path / "linear.json"
    code = bench.main(["--linear", "--device", "cuda", "--quick", "--shapes", "1536x1536,256x1024",
                       "--linear-m", "1,20", "--trials", "2", "--runs", "2", "--flush-mib", "64",
                       "--copy-mib", "64", "--no-progress", "--json", str(path), *extra])
    with open(path, encoding="utf-8") as f:
        return code, json.load(f)


@pytest.mark.gpu
@cuda_only
def test_linear_cuda_floor_model_and_dispatcher_choice(tmp_path, monkeypatch):
    monkeypatch.setenv("AWQ_FAST_DEQUANT_CACHE_DIR", str(tmp_path / "cache"))
    code, r = _bench_linear_cuda(tmp_path, "--no-host")
    assert code == 0, r["summary"]
    floor = r["launch_floor"]["median_us"]
    gbps = r["copy_bandwidth"]["gbps"]
    assert floor > 0 and gbps > 0
    lin = r["linear"]
    assert lin["framework"] == "torch" and lin["peak_flops"] == {"float16": 989e12}
    for lay in lin["layers"]:
        assert lay["error"] is None
        for p in lay["points"]:
            assert p["floor_model_us"] == pytest.approx(
                floor + max(p["bytes"] / (gbps * 1e3), p["flops"] / 989e6))
            assert p["auto_choice"]["kernel"] in ("gemv", "wgmma", "mma", "simt", "dequant")
            dense_us = p["impls"]["dense"]["stats"]["median_us"]
            for name, rec in p["impls"].items():
                assert rec["within_tolerance"] is True, (lay["label"], p["M"], name, rec["notes"])
                us = rec["stats"]["median_us"]
                assert rec["x_floor"] == pytest.approx(us / p["floor_model_us"])
                assert rec["x_dense"] == pytest.approx(dense_us / us)
                assert rec["gbps"] == pytest.approx(p["bytes"] / (us * 1e3))
            assert isinstance(p["impls"]["fused"]["materializes_w"], bool)
    rules = {t["id"]: t for t in r["verdict"]["targets"]}
    assert [(e["layer"], e["M"]) for e in rules["m1-floor-qwen"]["evaluations"]] == [("1536x1536", 1)]


@pytest.mark.gpu
@cuda_only
def test_host_overhead_has_the_linear_rows(tmp_path, monkeypatch):
    monkeypatch.setenv("AWQ_FAST_DEQUANT_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "host.json"
    code = bench.main(["--device", "cuda", "--no-main", "--host-repeats", "2", "--copy-mib", "64",
                       "--no-progress", "--json", str(path)])
    with open(path, encoding="utf-8") as f:
        cases = json.load(f)["host_overhead"]["cases"]
    assert code == 0
    for name in ("linear(out=out) fused, M=1", "linear(out=out) auto, M=1 cache hit"):
        assert cases[name]["error"] is None and cases[name]["median_us"] > 0


def test_smart_pick_reads_dequantize_entries_only(monkeypatch):
    """A linear entry of the same layer and dtype (the newer line of the
    file) is not smart_dequantize's pick."""
    import types

    from awq_fast_dequant.bench import measure
    from awq_fast_dequant.bench.shapes import Shape

    gen = awq.build_info()["kernel_generations"]["cpu"]
    common = dict(device="cpu x86_64 test 2t", gen=gen, K=256, N=512, G=128,
                  scales_dtype="float16", out_dtype="float16", block_size=0, rows=0, split=0,
                  threads=2, chunk=64, us=1.0)
    entries = [dict(common, op="dequantize", M=0, kernel="cpu"),
               dict(common, op="linear", M=1, kernel="dequant")]
    monkeypatch.setattr(awq, "cache_entries", lambda: [dict(e) for e in entries])
    ctx = types.SimpleNamespace(kind="cpu", cfg=types.SimpleNamespace(dtype="float16"))
    pick = measure.smart_pick(ctx, Shape("custom", 256, 512, 128))
    assert pick is not None and pick["op"] == "dequantize" and pick["kernel"] == "cpu"


def test_tolerance_check_of_a_whole_linear_result():
    torch = pytest.importorskip("torch")
    from awq_fast_dequant.bench import tolerance_check

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 64, generator=gen)
    W = torch.randn(64, 16, generator=gen)
    check = tolerance_check(torch, x, W)
    y = (x.double() @ W.double()).to(torch.float16)
    assert check(y) == (0, None)
    y[1, 5] += 1.0
    outside, note = check(y)
    assert outside == 1 and "y[1, 5]" in note
