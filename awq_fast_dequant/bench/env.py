"""Where and with what the benchmark ran: host, versions, build, git commit,
GPU properties, driver and nvidia-smi clocks. Nothing here raises: a missing
tool or a failed query leaves its field None."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import socket
import subprocess
import sys


def safe(fn, default=None):
    """fn(), or `default` when it raises: an environment field is never fatal."""
    try:
        return fn()
    except Exception:
        return default


def dist_version(dist: str):
    """The installed version of a distribution, or None."""
    from importlib import metadata

    return safe(lambda: metadata.version(dist))


def _git(tree: str, *args: str):
    out = subprocess.run(["git", "-C", tree, *args], capture_output=True, text=True, timeout=10)
    return out.stdout.strip() if out.returncode == 0 else None


def git_info() -> dict:
    """Commit of the package's source tree, when it is a git checkout (else nulls)."""
    from .. import __file__ as package_file

    tree = os.path.dirname(os.path.dirname(os.path.abspath(package_file)))
    top = safe(lambda: _git(tree, "rev-parse", "--show-toplevel"))
    # An installed package under some unrelated repository is not a checkout of ours.
    if not top or os.path.realpath(top) != os.path.realpath(tree):
        return {"commit": None, "dirty": None, "tree": tree}
    status = safe(lambda: _git(tree, "status", "--porcelain", "--untracked-files=no"))
    return {
        "commit": safe(lambda: _git(tree, "rev-parse", "HEAD")),
        "dirty": None if status is None else bool(status),
        "tree": tree,
    }


def _cpu_model():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


_SMI_FIELDS = ("index,name,driver_version,pstate,clocks.sm,clocks.mem,clocks.max.sm,"
               "clocks.max.mem,power.draw,power.limit,temperature.gpu,persistence_mode,"
               "memory.used,memory.total")


def nvidia_smi() -> list[dict] | None:
    """One dict per GPU from nvidia-smi, or None when it is missing or fails."""
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={_SMI_FIELDS}", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    keys = _SMI_FIELDS.split(",")
    rows = []
    for line in out.stdout.strip().splitlines():
        values = [v.strip() for v in line.split(",")]
        if len(values) == len(keys):
            rows.append(dict(zip(keys, values)))
    return rows


def _driver_cuda_version():
    """cuDriverGetVersion through libcuda (e.g. 13000 for CUDA 13.0), or None."""
    import ctypes

    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        version = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(version)) == 0:
            return version.value
    return None


def environment(device: str, torch=None, torch_device=None) -> dict:
    """Where and with what the benchmark ran. Never raises."""
    from .. import __version__, build_info, cache_path
    from ._dev import launch_path

    env = {
        "hostname": safe(socket.gethostname),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "platform": safe(platform.platform),
        "cpu": safe(_cpu_model),
        "cpu_count": os.cpu_count(),
        "versions": {
            "awq_fast_dequant": __version__,
            "numpy": dist_version("numpy"),
            "torch": dist_version("torch"),
            "ml_dtypes": dist_version("ml_dtypes"),
            "cupy": dist_version("cupy") or dist_version("cupy-cuda13x") or dist_version("cupy-cuda12x"),
            "tqdm": dist_version("tqdm"),
            "matplotlib": dist_version("matplotlib"),
            "vllm": dist_version("vllm"),
            "sgl_kernel": dist_version("sgl-kernel"),
        },
        "build_info": safe(build_info),
        "git": safe(git_info, {"commit": None, "dirty": None}),
        "cache_path": safe(cache_path),
        "environment_variables": {k: v for k, v in os.environ.items()
                                  if k.startswith("AWQ_FAST_DEQUANT_") or k == "CUDA_VISIBLE_DEVICES"
                                  or k == "OMP_NUM_THREADS"},
        "device": device,
    }
    if torch is not None and device.startswith("cuda"):
        props = safe(lambda: torch.cuda.get_device_properties(torch_device))
        env["gpu"] = None if props is None else {
            "name": props.name,
            "index": torch_device.index,
            "capability": f"{props.major}.{props.minor}",
            "sm_count": props.multi_processor_count,
            "memory_bytes": props.total_memory,
            "l2_bytes": getattr(props, "L2_cache_size", None),
        }
        env["cuda_runtime"] = {
            "torch": safe(lambda: torch.version.cuda),
            "awq_fast_dequant": (env["build_info"] or {}).get("cuda_runtime_version"),
        }
        env["driver_cuda_version"] = safe(_driver_cuda_version)
        env["launch_path"] = safe(launch_path)  # "driver" (cuLaunchKernel) or "runtime"
        smi = safe(nvidia_smi)
        env["nvidia_smi"] = smi
        env["driver"] = smi[0]["driver_version"] if smi else None
        env["torch_allow_tf32_matmul"] = safe(lambda: torch.backends.cuda.matmul.allow_tf32)
    return env
