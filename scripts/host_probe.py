"""What the host time of one dequantize call is made of, on a CUDA machine.

    python3 scripts/host_probe.py [--repeats 21]

Builds scripts/host_probe.cu with nvcc into a temporary folder, then times, in
C loops and from Python, with the GPU kept busy (torch.cuda._sleep) so that no
call waits on the device: a bare kernel launch through the runtime and through
the driver, the DLPack exchange-API calls a dequantize call makes, and the
package's own calls (the benchmark's host floor, out=, allocating).  Prints the
median, minimum and maximum over randomized repeats, in microseconds per call.
Not part of the package; a diagnostic for BENCHMARKS.md."""

import argparse
import ctypes
import pathlib
import random
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import awq_fast_dequant as awq
from awq_fast_dequant.bench import empty_launch

CALLS = 200  # per timed batch: far fewer than the launch queue holds
HERE = pathlib.Path(__file__).resolve().parent


def build(folder: str) -> str:
    so = str(pathlib.Path(folder) / "host_probe.so")
    subprocess.run(["nvcc", "-std=c++17", "-O2", "-shared", "-Xcompiler", "-fPIC", "-o", so,
                    str(HERE / "host_probe.cu")], check=True)
    return so


def exchange_api() -> int:
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return get(torch.Tensor.__dlpack_c_exchange_api__, b"dlpack_exchange_api")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=21,
                    help="shuffled repeats of every case (default 21)")
    args = ap.parse_args()
    if not torch.cuda.is_available() or not awq.cuda_available():
        print("host_probe: needs a CUDA GPU and a CUDA build of awq_fast_dequant", file=sys.stderr)
        return 2
    dev = torch.cuda.current_device()
    K = N = 1536
    G = 128
    qw = torch.randint(-2**31, 2**31 - 1, (K, N // 8), dtype=torch.int32, device="cuda")
    qz = torch.randint(-2**31, 2**31 - 1, (K // G, N // 8), dtype=torch.int32, device="cuda")
    sc = (torch.randn((K // G, N), device="cuda") * 0.01).half()
    out = torch.empty((K, N), dtype=torch.float16, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream

    with tempfile.TemporaryDirectory() as tmp:
        so = build(tmp)
        lib = ctypes.CDLL(so)     # launches: no Python inside
        pylib = ctypes.PyDLL(so)  # exchange API: called with the GIL held
    for f in (lib.launch_loop, lib.get_device_loop, pylib.dltensor_loop, pylib.stream_loop):
        f.restype = ctypes.c_double
    lib.launch_loop.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_ulonglong]
    lib.get_device_loop.argtypes = [ctypes.c_int]
    pylib.dltensor_loop.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.py_object]
    pylib.stream_loop.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    rc = lib.probe_init()
    if rc != 0:
        print(f"host_probe: probe_init failed ({rc})", file=sys.stderr)
        return 1
    api = exchange_api()

    def python_loop(fn):
        def run():
            t0 = time.perf_counter_ns()
            for _ in range(CALLS):
                fn()
            return (time.perf_counter_ns() - t0) / CALLS / 1e3
        return run

    cases = {
        "C launch, runtime <<<>>>": lambda: lib.launch_loop(CALLS, 0, stream),
        "C launch, driver cuLaunchKernel": lambda: lib.launch_loop(CALLS, 1, stream),
        "C exchange dltensor_from_py": lambda: pylib.dltensor_loop(CALLS, api, qw),
        "C exchange current_work_stream": lambda: pylib.stream_loop(CALLS, api, dev),
        "C cudaGetDevice": lambda: lib.get_device_loop(CALLS),
        "py qw.data_ptr()": python_loop(qw.data_ptr),
        "py host floor (empty_launch)": python_loop(lambda: empty_launch(dev, stream)),
        "py dequantize(out=)": python_loop(lambda: awq.dequantize(qw, qz, sc, group_size=G, out=out)),
        "py dequantize (allocating)": python_loop(lambda: awq.dequantize(qw, qz, sc, group_size=G)),
    }
    for fn in cases.values():
        for _ in range(3):
            if fn() < 0:
                print("host_probe: a C loop failed", file=sys.stderr)
                return 1
    res = {name: [] for name in cases}
    rng = random.Random(2)
    for _ in range(args.repeats):
        order = list(cases)
        rng.shuffle(order)
        for name in order:
            torch.cuda.synchronize()
            torch.cuda._sleep(100_000_000)
            done = torch.cuda.Event()
            done.record()
            us = cases[name]()
            if not done.query():  # the GPU was busy throughout: a host figure
                res[name].append(us)
            torch.cuda.synchronize()
    print(f"{'host time per call (us)':34s} {'median':>7s} {'min':>6s} {'max':>6s} {'n':>3s}")
    med = {}
    for name, v in res.items():
        if not v:
            print(f"{name:34s} (the GPU went idle in every repeat)")
            continue
        v.sort()
        med[name] = statistics.median(v)
        print(f"{name:34s} {med[name]:7.2f} {v[0]:6.2f} {v[-1]:6.2f} {len(v):3d}")
    try:
        above = med["py dequantize(out=)"] - med["py host floor (empty_launch)"]
        parts = 4 * med["C exchange dltensor_from_py"] + med["C exchange current_work_stream"]
        print(f"out= above the host floor: {above:.2f} us; of it, 4 tensors and the current stream "
              f"through the exchange API: {parts:.2f} us")
    except KeyError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
