"""build_info() reports what was compiled in, the package agrees with it, and an import
that cannot find the compiled extension says why and what to do."""

import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import awq_fast_dequant as awq
from awq_fast_dequant import _C, reference

from conftest import DLPackOnly, make_problem


def test_build_info_fields():
    info = awq.build_info()
    for key in ("version", "compiler", "openmp", "cuda", "cuda_archs", "cuda_runtime_version",
                "cpu_simd", "cpu_amx", "cpu_max_threads"):
        assert key in info, key
    assert isinstance(info["openmp"], bool) and isinstance(info["cuda"], bool)
    assert isinstance(info["cpu_amx"], bool)
    assert not (info["cpu_amx"] and info["cpu_simd"] == "scalar")
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
    assert isinstance(awq.cuda_available(), bool)


def test_a_second_instance_of_the_extension_has_its_own_state(rng):
    """Multi-phase init: loading the extension again gives a new module with its
    own state. The package registered its output allocator on its own instance
    only, so the new one has none for a producer that needs it (DLPack without
    the exchange API), while NumPy inputs, which need none, work on both."""
    spec = importlib.util.find_spec("awq_fast_dequant._C")
    second = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(second)
    assert second is not _C and second.__name__ == _C.__name__ == "awq_fast_dequant._C"
    assert second.build_info() == _C.build_info()
    qw, qz, sc = make_problem(rng, 64, 32, 32)
    expect = reference.dequantize(qw, qz, sc)
    reference.assert_bitexact(second.dequantize(qw, qz, sc), expect)
    with pytest.raises(RuntimeError, match="no output allocator registered"):
        second.dequantize(*(DLPackOnly(a) for a in (qw, qz, sc)))
    reference.assert_bitexact(_C.dequantize(*(DLPackOnly(a) for a in (qw, qz, sc))), expect)


def test_reload_keeps_the_package_working(rng):
    """importlib.reload runs the package's __init__ again over the same extension
    module: the public names still are the C functions, and the hooks it registers
    again still allocate outputs."""
    importlib.reload(awq)
    assert awq._C is _C and awq.dequantize is _C.dequantize
    assert awq.__version__ == _C.__version__
    qw, qz, sc = make_problem(rng, 64, 32, 32)
    got = awq.dequantize(*(DLPackOnly(a) for a in (qw, qz, sc)))
    assert isinstance(got, np.ndarray)
    reference.assert_bitexact(got, reference.dequantize(qw, qz, sc))


def test_in_place_rebuild_follows_the_build_configuration(tmp_path):
    """setuptools relinks only when a source is newer than the extension; the
    build records its configuration so that an in-place rebuild with other
    settings (here the debug flags) relinks, and one with the same settings
    leaves the extension alone."""
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


def _package_copy_without_extension(folder):
    """The package's Python files, copied into folder/awq_fast_dequant, with no _C."""
    source = os.path.dirname(os.path.abspath(awq.__file__))
    shutil.copytree(source, folder / "awq_fast_dequant",
                    ignore=shutil.ignore_patterns("_C.*", "__pycache__"))
    return folder / "awq_fast_dequant"


def _import_in(folder):
    """`python -c "import awq_fast_dequant"` started in folder, whose package folder
    comes first on sys.path, as a source checkout's does."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", "import awq_fast_dequant"], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=120)


def test_import_from_a_source_folder_says_what_to_do(tmp_path):
    _package_copy_without_extension(tmp_path)
    r = _import_in(tmp_path)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: awq_fast_dequant's compiled extension (_C) is not in "
                           + str(tmp_path / "awq_fast_dequant")), r.stderr
    assert "source folder" in last and "`pip install .`" in last and "another folder" in last
    assert "circular import" not in r.stderr  # the misleading bare failure is not shown


def test_an_extension_that_fails_to_load_is_named(tmp_path):
    package = _package_copy_without_extension(tmp_path)
    broken = package / ("_C" + importlib.machinery.EXTENSION_SUFFIXES[0])
    broken.write_bytes(b"not a shared object")
    r = _import_in(tmp_path)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ImportError: awq_fast_dequant's compiled extension {broken} "
                           "failed to load: "), r.stderr
    assert "pip install --force-reinstall" in last
