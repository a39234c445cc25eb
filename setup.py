"""Build of awq_fast_dequant._C (metadata lives in pyproject.toml).

The extension is plain C against the CPython and NumPy C APIs.  When nvcc
is found, csrc/cuda/*.cu is compiled ahead of time into objects that are
linked into the same extension with the CUDA runtime linked statically;
otherwise csrc/cuda/stub.c stands in and the build is CPU-only.  Each stage
prints one line (`pip install -v .` shows them).

Build knobs (environment variables):
  AWQ_FAST_DEQUANT_NO_CUDA=1        CPU-only build even when nvcc exists
  AWQ_FAST_DEQUANT_CUDA_ARCHS="80;90"  cubins to build (default: every one of
                                    75;80;86;89;90;100;120 that nvcc supports),
                                    plus PTX for the newest
  NVCC, CUDA_HOME / CUDA_PATH       where to find nvcc (then PATH, then /usr/local/cuda)
  AWQ_FAST_DEQUANT_DEBUG=1          -O0 -g, host and device
  AWQ_FAST_DEQUANT_WERROR=1         warnings are errors (CI), ptxas's report of
                                    serialized wgmma (C75xx) included
  AWQ_FAST_DEQUANT_SANITIZE=address build the C code with a sanitizer
  AWQ_FAST_DEQUANT_NVCC_FLAGS="..."  extra nvcc flags (kernel experiments)
  AWQ_FAST_DEQUANT_NVCC_THREADS=N   architectures nvcc compiles at once (default:
                                    one per CPU, 0; 1 compiles them one by one)
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join(ROOT, "csrc")
WANTED_ARCHS = [75, 80, 86, 89, 90, 100, 120]


def env_flag(name):
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def read_version():
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        m = re.search(r'^version\s*=\s*"([^"]+)"', f.read(), re.M)
    if not m:
        raise RuntimeError("no version in pyproject.toml")
    return m.group(1)


# ptxas's "Potential Performance Loss: wgmma.mma_async instructions are
# serialized ..." (C7510 to C7515 and their kin), which it prints as info.
SERIALIZED_WGMMA = re.compile(r"\(C75\d\d\)")


def log(msg):
    print(f"awq_fast_dequant build: {msg}", file=sys.stderr, flush=True)


def find_nvcc():
    """NVCC, then CUDA_HOME/CUDA_PATH, then PATH, then /usr/local/cuda."""
    candidates = [os.environ.get("NVCC")]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(os.path.join(os.environ[var], "bin", "nvcc"))
    candidates.append(shutil.which("nvcc"))
    candidates.append("/usr/local/cuda/bin/nvcc")
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.realpath(c)
    return None


def cuda_home_of(nvcc):
    """The toolkit folder; nvcc may be a wrapper script, so ask it (TOP=...)."""
    try:
        with tempfile.TemporaryDirectory() as tmp:
            probe = os.path.join(tmp, "probe.cu")
            open(probe, "w").close()
            out = subprocess.run([nvcc, "--dryrun", "-c", probe, "-o", probe + ".o"],
                                 capture_output=True, text=True, timeout=60)
        m = re.search(r"^#\$ TOP=(.+)$", out.stdout + out.stderr, re.M)
        if m:
            return os.path.realpath(m.group(1).strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return os.path.dirname(os.path.dirname(nvcc))


def cuda_lib_dir(home):
    for sub in ("lib64", "lib", os.path.join("targets", "x86_64-linux", "lib"),
                os.path.join("targets", "sbsa-linux", "lib")):
        d = os.path.join(home, sub)
        if os.path.isfile(os.path.join(d, "libcudart_static.a")):
            return d
    return None


def nvcc_threads(nvcc):
    """nvcc's --threads argument (architectures compiled in parallel), or []
    when this nvcc has no such option (before CUDA 11.2)."""
    wanted = os.environ.get("AWQ_FAST_DEQUANT_NVCC_THREADS", "0").strip() or "0"
    if not wanted.isdigit():
        raise RuntimeError(f"AWQ_FAST_DEQUANT_NVCC_THREADS must be a number >= 0; got {wanted!r}")
    try:
        help_text = subprocess.run([nvcc, "--help"], capture_output=True, text=True,
                                   check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    return ["--threads", wanted] if "--threads" in help_text else []


def supported_archs(nvcc):
    try:
        out = subprocess.run([nvcc, "--list-gpu-code"], capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    return sorted({int(m) for m in re.findall(r"sm_(\d+)\b", out)})


def choose_archs(nvcc):
    override = os.environ.get("AWQ_FAST_DEQUANT_CUDA_ARCHS", "").strip()
    if override:
        archs = [int(a) for a in re.split(r"[;, ]+", override) if a]
        log(f"CUDA architectures from AWQ_FAST_DEQUANT_CUDA_ARCHS: {archs}")
        return archs
    have = supported_archs(nvcc)
    return [a for a in WANTED_ARCHS if a in have]


class BuildExt(build_ext):
    """Compile csrc/*.cu with nvcc first, then the C sources as usual."""

    def build_extensions(self):
        ext = self.extensions[0]
        self._stamp = os.path.join(self.build_temp, "awq_build_config.json")
        try:
            with open(self._stamp, encoding="utf-8") as f:
                self._previous = json.load(f)
        except (OSError, ValueError):
            self._previous = None
        self._nvcc_cmds = []
        openmp = self._has_openmp()
        if openmp:
            ext.extra_compile_args.append("-fopenmp")
            ext.extra_link_args.append("-fopenmp")
        log(f"OpenMP {'enabled' if openmp else 'not available: single-threaded CPU path'}")

        nvcc = None if env_flag("AWQ_FAST_DEQUANT_NO_CUDA") else find_nvcc()
        libdir = cuda_lib_dir(cuda_home_of(nvcc)) if nvcc else None
        archs = choose_archs(nvcc) if nvcc else []
        has_cu = bool(cuda_sources())
        if nvcc and libdir and archs and has_cu:
            log(f"CUDA build with {nvcc}, architectures {archs}")
            ext.sources = [s for s in ext.sources if not s.endswith(os.path.join("cuda", "stub.c"))]
            ext.extra_objects += self._compile_cuda(nvcc, archs)
            ext.library_dirs.append(libdir)
            ext.libraries += ["cudart_static", "stdc++", "dl", "rt", "pthread"]
        else:
            why = ("AWQ_FAST_DEQUANT_NO_CUDA is set" if env_flag("AWQ_FAST_DEQUANT_NO_CUDA")
                   else "nvcc not found" if not nvcc
                   else "libcudart_static.a not found" if not libdir
                   else "no CUDA sources" if not has_cu
                   else "no supported architecture")
            log(f"CPU-only build ({why}); CUDA tensors will raise RuntimeError")
        config = self._force_if_configuration_changed(ext)
        log(f"compiling {len(ext.sources)} C sources and linking awq_fast_dequant._C")
        super().build_extensions()
        log("done")
        with open(self._stamp, "w", encoding="utf-8") as f:
            json.dump(config, f)

    def _force_if_configuration_changed(self, ext):
        """Relink when the build configuration differs from the last build in
        this build directory (CUDA on or off, architectures, flags): setuptools
        only compares the times of sources and headers, so switching e.g. to a
        CPU-only build in place would otherwise keep the previous extension.
        Returns the configuration, recorded once the build succeeds."""
        config = {"sources": ext.sources, "objects": ext.extra_objects,
                  "libraries": ext.libraries, "cflags": ext.extra_compile_args,
                  "ldflags": ext.extra_link_args, "nvcc": self._nvcc_cmds}
        if self._previous != config:
            if self._previous is not None:
                log("build configuration changed since the last build here: relinking")
                os.remove(self._stamp)  # a failed build must not look current
            self.force = True
        os.makedirs(self.build_temp, exist_ok=True)
        return config

    def _object_current(self, cmd, src, obj):
        """An object from the last build with the same nvcc command, newer than
        its source and every header, needs no recompiling."""
        if self.force or self._previous is None or cmd not in self._previous.get("nvcc", []):
            return False
        if not os.path.exists(obj):
            return False
        inputs = [src] + headers()
        return all(os.path.getmtime(obj) >= os.path.getmtime(i) for i in inputs)

    def _has_openmp(self):
        src = "#include <omp.h>\nint main(void) { return omp_get_max_threads() > 0 ? 0 : 1; }\n"
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "omp_probe.c")
            with open(path, "w") as f:
                f.write(src)
            try:
                objs = self.compiler.compile([path], output_dir=tmp, extra_postargs=["-fopenmp"])
                self.compiler.link_executable(objs, "omp_probe", output_dir=tmp,
                                              extra_postargs=["-fopenmp"])
                return True
            except Exception:  # any compile or link failure means "no OpenMP"
                return False

    def _compile_cuda(self, nvcc, archs):
        debug = env_flag("AWQ_FAST_DEQUANT_DEBUG")
        out_dir = os.path.join(self.build_temp, "cuda")
        os.makedirs(out_dir, exist_ok=True)
        gencode = []
        for a in archs:
            # 9.0 gets the sm_90a machine code: the warpgroup kernel's wgmma
            # exists only there, and the rest of the code is the same
            v = f"{a}a" if a == 90 else f"{a}"
            gencode += ["-gencode", f"arch=compute_{v},code=sm_{v}"]
        newest = max(archs)
        gencode += ["-gencode", f"arch=compute_{newest},code=compute_{newest}"]
        arch_list = ";".join(str(a) for a in archs)
        threads = nvcc_threads(nvcc)
        objects = []
        sources = cuda_sources()
        for i, src in enumerate(sources, 1):
            name = os.path.relpath(src, CSRC)
            obj = os.path.join(out_dir, name.replace(os.sep, "_")[:-3] + ".o")
            cmd = [nvcc, "-c", src, "-o", obj, "-std=c++17", "-I", CSRC,
                   "-Xcompiler", "-fPIC", "-Xcompiler", "-fvisibility=hidden",
                   f'-DAWQ_CUDA_ARCHS="{arch_list}"', *gencode, *threads]
            cmd += ["-O0", "-g", "-G"] if debug else ["-O3", "-lineinfo"]
            if env_flag("AWQ_FAST_DEQUANT_WERROR"):
                cmd += ["-Werror", "all-warnings"]
            cmd += os.environ.get("AWQ_FAST_DEQUANT_NVCC_FLAGS", "").split()
            self._nvcc_cmds.append(cmd)
            objects.append(obj)
            if self._object_current(cmd, src, obj):
                log(f"[{i}/{len(sources)}] {name}: up to date")
                continue
            how = "in parallel" if threads and threads[1] != "1" else "one after another"
            log(f"[{i}/{len(sources)}] nvcc {name} for sm_{', sm_'.join(map(str, archs))} ({how})")
            started = time.monotonic()
            done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            sys.stderr.write(done.stdout)
            if done.returncode:
                raise subprocess.CalledProcessError(done.returncode, cmd, done.stdout)
            if SERIALIZED_WGMMA.search(done.stdout):
                # ptxas reports these as "info": the build works, the warpgroup kernel is slow
                msg = f"{name}: ptxas serialized wgmma instructions (the C75xx message above)"
                if env_flag("AWQ_FAST_DEQUANT_WERROR"):
                    raise RuntimeError(msg)
                log(f"warning: {msg}")
            log(f"[{i}/{len(sources)}] {name}: {time.monotonic() - started:.0f} s")
        return objects


def headers():
    """Every header under csrc/ (a change to one recompiles what includes it)."""
    out = []
    for root, _, files in os.walk(CSRC):
        out += [os.path.join(root, f) for f in files if f.endswith((".h", ".cuh"))]
    return sorted(out)


def cuda_sources():
    return sorted(os.path.join(CSRC, "cuda", f) for f in os.listdir(os.path.join(CSRC, "cuda"))
                  if f.endswith(".cu"))


# The C sources of the extension, by concern (csrc/ has the map).
C_SOURCES = [
    "module.c", "args.c", "validate.c", "views.c", "alloc.c", "run.c", "dequantize.c",
    "linear.c", "module_call.c", "prepared.c", "cache.c", "dev.c",
    "autotune/table.c", "autotune/file.c", "autotune/tune.c",
    "cpu/platform.c", "cpu/dequantize.c", "cpu/linear.c", "cpu/amx.c", "cpu/tune.c",
    "cuda/stub.c",
]


def extension():
    debug = env_flag("AWQ_FAST_DEQUANT_DEBUG")
    cflags = ["-std=c11", "-ffp-contract=off", "-Wall", "-Wextra", "-Wno-unused-parameter",
              "-Wno-missing-field-initializers"]
    cflags += ["-O0", "-g"] if debug else ["-O3"]
    ldflags = []
    if env_flag("AWQ_FAST_DEQUANT_WERROR"):
        cflags.append("-Werror")
    sanitize = os.environ.get("AWQ_FAST_DEQUANT_SANITIZE", "").strip()
    if sanitize:
        cflags += [f"-fsanitize={sanitize}", "-fno-omit-frame-pointer"]
        ldflags.append(f"-fsanitize={sanitize}")
    return Extension(
        "awq_fast_dequant._C",
        sources=[os.path.join("csrc", s) for s in C_SOURCES],
        include_dirs=[CSRC, numpy.get_include()],
        define_macros=[("AWQ_VERSION", f'"{read_version()}"')],
        extra_compile_args=cflags,
        extra_link_args=ldflags,
        depends=[os.path.relpath(h, ROOT) for h in headers() + cuda_sources()],
    )


setup(ext_modules=[extension()], cmdclass={"build_ext": BuildExt})
