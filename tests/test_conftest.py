"""The suite's own machinery in tests/conftest.py: the line that says why tests skipped."""

import os
import shutil
import subprocess
import sys
import textwrap

from conftest import child_env, skip_summary


def test_skip_summary_groups_reasons_largest_group_first():
    reasons = ["needs torch", "needs a CUDA GPU", "needs two GPUs", "needs a CUDA GPU",
               "needs a CUDA GPU", "needs torch"]
    assert skip_summary(reasons) == ("skipped: 6 -- 3 needs a CUDA GPU, 2 needs torch, "
                                     "1 needs two GPUs")


def test_pytest_prints_the_skip_summary(tmp_path):
    """A run of four skipped tests (three with one reason, one through importorskip)
    and one passing test ends with the grouped line."""
    shutil.copy(os.path.join(os.path.dirname(os.path.abspath(__file__)), "conftest.py"), tmp_path)
    (tmp_path / "test_skips.py").write_text(textwrap.dedent("""
        import pytest

        @pytest.mark.skipif(True, reason="needs a CUDA GPU")
        @pytest.mark.parametrize("i", range(3))
        def test_on_a_gpu(i):
            pass

        def test_with_a_missing_module():
            pytest.importorskip("awq_fast_dequant_no_such_module")

        def test_that_runs():
            pass
    """))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        str(tmp_path)], cwd=tmp_path, env=child_env(), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert ("skipped: 4 -- 3 needs a CUDA GPU, 1 needs awq_fast_dequant_no_such_module"
            in r.stdout.splitlines()), r.stdout
