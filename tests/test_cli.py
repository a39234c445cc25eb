"""The command line (awq_fast_dequant/__main__.py): one program name, help texts that
state their defaults, cache and tune, and a reader that stops early."""

import argparse
import os
import subprocess
import sys

import pytest

import awq_fast_dequant as awq
from awq_fast_dequant.__main__ import PROG, build_parser, main

from conftest import child_env

COMMANDS = ("info", "cache", "tune", "bench")


def cli(tmp_path, *args, check=True, **kw):
    """`python -m awq_fast_dequant ARGS` in tmp_path, with its autotune cache there."""
    r = subprocess.run([sys.executable, "-m", "awq_fast_dequant", *args], cwd=tmp_path,
                       env=child_env(AWQ_FAST_DEQUANT_CACHE_DIR=str(tmp_path)),
                       capture_output=True, text=True, timeout=120, **kw)
    if check:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


def subcommand_parsers():
    """{name: parser} of the subcommands this module parses (bench parses its own)."""
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return {name: p for name, p in sub.choices.items() if name != "bench"}


def test_every_option_states_its_default():
    for name, parser in subcommand_parsers().items():
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"{name} {action.dest}: no help text"
            if action.option_strings:
                assert "default" in action.help, f"{name} {action.option_strings}: {action.help}"


@pytest.mark.parametrize("command", COMMANDS)
def test_every_subcommand_shows_the_same_program_name(capsys, command):
    try:
        code = main([command, "--help"])
    except SystemExit as exc:  # argparse exits after --help
        code = exc.code
    assert code == 0
    assert capsys.readouterr().out.startswith(f"usage: {PROG} {command} ")


def test_python_m_and_the_script_show_the_same_usage(tmp_path):
    script = os.path.join(os.path.dirname(sys.executable), "awq-fast-dequant")
    if not os.path.exists(script):
        pytest.skip("the awq-fast-dequant script is not installed next to this Python")
    by_module = cli(tmp_path, "tune", "--help").stdout
    by_script = subprocess.run([script, "tune", "--help"], cwd=tmp_path, env=child_env(),
                               capture_output=True, text=True, timeout=120)
    assert by_script.returncode == 0, by_script.stderr
    assert by_module == by_script.stdout
    assert by_module.startswith(f"usage: {PROG} tune ")


def test_cache_and_tune(tmp_path):
    assert cli(tmp_path, "cache", "path").stdout.strip() == str(tmp_path / "autotune.txt")
    out = cli(tmp_path, "tune", "--shapes", "128x64,256x128", "--group", "64", "--device",
              "cpu").stdout
    assert "tunings this run: 2" in out
    shown = cli(tmp_path, "cache", "show").stdout
    assert "2 entries" in shown and "128" in shown and "256" in shown
    cli(tmp_path, "cache", "clear")
    assert "0 entries" in cli(tmp_path, "cache", "show").stdout


def test_tune_says_per_shape_whether_it_tuned_or_found_the_cache(tmp_path):
    first = cli(tmp_path, "tune", "--shapes", "128x64", "--group", "64", "--device", "cpu")
    second = cli(tmp_path, "tune", "--shapes", "128x64,256x64", "--group", "64", "--device",
                 "cpu")
    assert first.stdout.splitlines()[0] == "128x64 G=64 float16 on cpu: tuned"
    assert second.stdout.splitlines()[:2] == ["128x64 G=64 float16 on cpu: cached",
                                              "256x64 G=64 float16 on cpu: tuned"]
    assert "tunings this run: 1" in second.stdout


@pytest.mark.parametrize("args,message", [
    (["--shapes", "4096"], "argument --shapes: wants KxN items"),
    (["--shapes", "100x64"], "K must be a multiple of --group (128)"),
    (["--shapes", "128x64", "--group", "0"], "argument --group: wants a positive integer"),
])
def test_tune_usage_errors_exit_2(tmp_path, args, message):
    r = cli(tmp_path, "tune", *args, "--device", "cpu", check=False)
    assert r.returncode == 2
    assert f"usage: {PROG} tune " in r.stderr and message in r.stderr
    assert "Traceback" not in r.stderr


def test_a_reader_that_stops_early_gets_no_traceback(tmp_path):
    """`cache show | head -1`: the output (a few hundred KB, more than a pipe holds)
    meets a closed pipe; the command ends quietly with SIGPIPE's status, 141."""
    gen = awq.build_info()["kernel_generations"]["cpu"]
    lines = [f"cpu x86_64 test 2t\t{gen}\tdequantize\t{8 * (k + 1)}\t64\t8\t0\tfloat16\tfloat16"
             f"\tcpu\t0\t0\t0\t1\t8\t12.5\n" for k in range(4000)]
    (tmp_path / "autotune.txt").write_text("# awq_fast_dequant autotune cache v3\n"
                                           + "".join(lines))
    proc = subprocess.Popen([sys.executable, "-m", "awq_fast_dequant", "cache", "show"],
                            cwd=tmp_path, env=child_env(AWQ_FAST_DEQUANT_CACHE_DIR=str(tmp_path)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()  # the reader stops here
    stderr = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=120) == 141, stderr
    assert b"4000 entries" in first
    assert stderr == ""
