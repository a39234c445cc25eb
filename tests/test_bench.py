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
    # a leading underscore marks a private name; dunders (__version__) are public
    private = re.compile(r"\b_C\b|awq_fast_dequant\._(?!_)|from awq_fast_dequant\.bench\.\w+ import"
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
