"""build_info() reports what was compiled in, and the package agrees with it."""

import importlib.metadata
import re

import awq_fast_dequant as awq


def test_build_info_fields():
    info = awq.build_info()
    for key in ("version", "compiler", "openmp", "cuda", "cuda_archs", "cuda_runtime_version",
                "cpu_simd", "cpu_max_threads"):
        assert key in info, key
    assert isinstance(info["openmp"], bool) and isinstance(info["cuda"], bool)
    assert info["cpu_max_threads"] >= 1
    if info["cuda"]:
        assert info["cuda_archs"] and all(a >= 75 for a in info["cuda_archs"])
        assert info["cuda_runtime_version"] >= 11000
    else:
        assert info["cuda_archs"] == [] and not awq.cuda_available()


def test_single_version_string():
    assert awq.__version__ == awq.build_info()["version"]
    assert awq.__version__ == importlib.metadata.version("awq_fast_dequant")
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", awq.__version__)


def test_cuda_available_is_bool():
    assert awq.cuda_available() in (True, False)


def test_extension_is_multiphase_and_reimportable():
    import importlib
    import awq_fast_dequant._C as c
    assert c.__name__ == "awq_fast_dequant._C"
    assert importlib.reload(awq) is awq


def test_in_place_rebuild_follows_the_build_configuration(tmp_path):
    """setuptools relinks only when a source is newer than the extension; the
    build records its configuration so that an in-place rebuild with other
    settings (here the debug flags) relinks, and one with the same settings
    leaves the extension alone."""
    import os
    import shutil
    import subprocess
    import sys

    import pytest

    pytest.importorskip("setuptools")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.path.exists(os.path.join(root, "setup.py")):
        pytest.skip("needs the source tree")
    for name in ("setup.py", "pyproject.toml"):
        shutil.copy(os.path.join(root, name), tmp_path)
    shutil.copytree(os.path.join(root, "csrc"), tmp_path / "csrc")
    shutil.copytree(os.path.join(root, "awq_fast_dequant"), tmp_path / "awq_fast_dequant",
                    ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__"))

    def build(**env):
        env = dict({k: v for k, v in os.environ.items() if not k.startswith("AWQ_FAST_DEQUANT_")},
                   AWQ_FAST_DEQUANT_NO_CUDA="1", **env)
        r = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=tmp_path,
                           env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-2000:]
        (so,) = [p for p in (tmp_path / "awq_fast_dequant").glob("_C.*") if p.suffix != ".pyi"]
        return so.stat().st_mtime_ns, so.read_bytes(), r.stderr

    first, first_bytes, _ = build()
    same, same_bytes, _ = build()
    assert (same, same_bytes) == (first, first_bytes)  # nothing changed: not relinked
    debug, debug_bytes, log = build(AWQ_FAST_DEQUANT_DEBUG="1")
    assert "build configuration changed" in log
    assert debug != first and debug_bytes != first_bytes
