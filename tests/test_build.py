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
