"""The standalone C test of the host's fused linear (tests/c/test_linear_cpu.c,
ASan + UBSan, OpenMP), where make and a C compiler exist."""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_c_linear_cpu_tests_pass():
    """Random problems against a float64 reference, NaN/Inf scales, the same
    bits for every thread count and chunk, the scalar path equal to the
    vector path bit for bit."""
    if not shutil.which("make") or not shutil.which(os.environ.get("CC", "gcc")):
        pytest.skip("no make / C compiler")
    if not os.path.exists(os.path.join(ROOT, "csrc", "cpu", "linear.c")):
        pytest.skip("sources not available (installed package only)")
    r = subprocess.run(["make", "-s", "-C", os.path.join(ROOT, "tests", "c"), "linear"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "0 failed" in r.stdout, r.stdout[-3000:]
