"""Benchmark of AWQ dequantization: ``python -m awq_fast_dequant bench``.

Method (DESIGN.md section 6, written out in docs/BENCHMARKS.md): per layer
shape, T trials x R timed runs, the implementations in a fresh random order
each trial; on CUDA every timed launch is preceded by an L2 flush and timed
alone between a pair of CUDA events; the result of every trial is compared
bit for bit with the NumPy reference. Reported: median and mean (flagged
when they differ by more than 15%), achieved GB/s of the roofline byte count
and its share of a copy measured in the same run; host microseconds per call
with the GPU kept busy; optionally a block-size sweep (--sweep) and a prefill
layer benchmark (--prefill).

Exit status: 0 when everything ran and every one of our implementations
(v1..v4, smart, cpu, and the torch/numpy baselines) was bit-exact on every
trial; 1 otherwise; 2 for a bad command line. Peers (vllm, sglang) that
differ are reported, not failed.

Test hook: register_impl(name, fn) adds an implementation in-process; the
environment variable AWQ_FAST_DEQUANT_BENCH_INJECT=name adds one that is
deliberately one ulp off, held to the contract like ours.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
import traceback
from dataclasses import dataclass

import numpy as np

from . import _bench_report as report
from ._frameworks import numpy_dtype
from ._bench_impls import (
    CUDA_KERNELS,
    DTYPE_BYTES,
    DTYPES,
    PEERS,
    POISON,
    Case,
    Impl,
    NumpyCheck,
    TorchCheck,
    cuda_case,
    load_peer,
    make_inputs,
    numpy_dequantize,
    register_impl,
    registered_impls,
    torch_dequantize,
    unregister_impl,
)
from ._bench_timing import (
    UNSTABLE_GAP,
    CpuTimer,
    CudaTimer,
    cpu_copy_bandwidth,
    cuda_copy_bandwidth,
    host_overhead,
    run_trials,
    summarize,
    warm_up,
)

__all__ = ["main", "register_impl", "unregister_impl", "PRESETS", "bytes_moved"]

SCHEMA = "awq_fast_dequant.bench/1"

# The layer shapes of DESIGN.md section 6: (K = in_features, N = out_features).
PRESETS = {
    "qwen2.5-1.5b": ((1536, 1536), (1536, 8960), (8960, 1536)),
    "llama-3-8b": ((4096, 4096), (4096, 14336), (14336, 4096)),
    "llama-3-70b": ((8192, 8192), (8192, 28672), (28672, 8192)),
}

DEFAULT_KERNELS = {
    "cuda": ("v1", "v2", "v3", "v4", "smart", "torch", "vllm", "sglang"),
    "cpu": ("cpu", "smart", "numpy"),
}
KNOWN_KERNELS = {
    "cuda": ("v1", "v2", "v3", "v4", "smart", "torch", "vllm", "sglang"),
    "cpu": ("cpu", "smart", "numpy", "torch"),
}
BASELINES = ("torch", "numpy")

# --sweep candidates: v3 and v4 over every block size the public API can set.
SWEEP_V3_BLOCKS = (64, 128, 256, 512, 1024)
SWEEP_V4_BLOCKS = (64, 128, 256, 512)

PREFILL_TOKENS = (256, 1024, 4096)

# Host overhead: calls per repeat stay well under the launch queue's depth
# (about a thousand kernels): ours launch one kernel per call, the torch
# baseline about ten.
HOST_CALLS_OURS = 200
HOST_CALLS_TORCH = 40
# torch.cuda._sleep cycles: ~100 ms at 2 GHz, far longer than the timed calls.
HOST_SLEEP_CYCLES = 200_000_000
# The host-overhead cases, in this order (Run.host builds them).
HOST_CASES = (report.HOST_FLOOR_CASE, "dequantize(out=out)", "dequantize() allocating",
              "smart_dequantize(out=out) cache hit", "torch baseline (allocating)")


def bytes_moved(K: int, N: int, G: int, dtype: str) -> int:
    """Roofline bytes: qweight K*N/2 + qzeros 4*(K/G)*(N/8) + scales s*(K/G)*N + out o*K*N."""
    s = o = DTYPE_BYTES[dtype]
    return K * N // 2 + 4 * (K // G) * (N // 8) + s * (K // G) * N + o * K * N


@dataclass(frozen=True)
class Shape:
    model: str
    K: int
    N: int
    G: int

    @property
    def label(self) -> str:
        return f"{self.K}x{self.N}"


# The launch floor (CUDA): v4 on the smallest layer, one word (K = G = 1, N = 8),
# timed like every shape. A layer's floor model is that time plus the layer's
# bytes at the copy bandwidth of the same run: what a kernel that launches and
# moves those bytes and nothing else would be timed at on this machine.
FLOOR_SHAPE = Shape("floor", 1, 8, 1)


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------


def build_parser(prog: str = "awq-fast-dequant bench") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Benchmark AWQ dequantization (bit-exact checked) on CUDA or the CPU.",
        epilog="Exit status: 0 all ran and all of ours bit-exact, 1 otherwise, 2 bad arguments. "
               "Method and column meanings: docs/BENCHMARKS.md.")
    p.add_argument("--device", default=None,
                   help="cuda, cuda:N or cpu (default: cuda when available, else cpu)")
    p.add_argument("--shapes", default="qwen2.5-1.5b,llama-3-8b,llama-3-70b",
                   help="comma list of presets (" + ", ".join(PRESETS) + ", all) and KxN items "
                        "(K = in_features = qweight rows, N = out_features; KxN:G sets G for one "
                        "shape); default: the three presets, 9 shapes")
    p.add_argument("--group", type=int, default=128, help="group size G (default 128)")
    p.add_argument("--dtype", choices=DTYPES, default="float16",
                   help="scales and output dtype (default float16)")
    p.add_argument("--kernels", default=None,
                   help="comma list; cuda: v1,v2,v3,v4,smart,torch,vllm,sglang (default all); "
                        "cpu: cpu,smart,numpy,torch (default cpu,smart,numpy)")
    p.add_argument("--trials", type=int, default=15, help="trials per shape (default 15)")
    p.add_argument("--runs", type=int, default=10, help="timed runs per trial (default 10)")
    p.add_argument("--json", metavar="PATH", help="write every raw timing and the environment here")
    p.add_argument("--plot", metavar="PATH",
                   help="PNG prefix (PATH_gbps.png, PATH_host.png, PATH_prefill.png) or a folder")
    p.add_argument("--sweep", action="store_true",
                   help="also time v3 and v4 over every block size, against smart_dequantize's pick")
    p.add_argument("--prefill", action="store_true",
                   help="also time dequantize+matmul against a dense matmul (CUDA only)")
    p.add_argument("--prefill-tokens", default=",".join(map(str, PREFILL_TOKENS)),
                   help="token counts M for --prefill (default 256,1024,4096)")
    p.add_argument("--seed", type=int, default=0, help="seed of the data and of the run orders")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-main", action="store_true",
                   help="skip the main timing (e.g. run only --sweep or --prefill)")
    p.add_argument("--no-host", action="store_true", help="skip the host-overhead measurement")
    p.add_argument("--host-shape", default="1536x1536",
                   help="shape of the host-overhead measurement (default 1536x1536)")
    p.add_argument("--host-repeats", type=int, default=7,
                   help="repeats of the host-overhead measurement (default 7)")
    p.add_argument("--flush-mib", type=int, default=None,
                   help="cache-flush buffer written before each timed run "
                        "(default: max(256, 2 x L2) MiB on CUDA, 256 MiB on the CPU)")
    p.add_argument("--copy-mib", type=int, default=1024,
                   help="buffer of the device-to-device copy measurement on CUDA (default 1024)")
    p.add_argument("--ncu-driver", action="store_true",
                   help="(for scripts/ncu_profile.sh) launch each --kernels kernel once on the "
                        "first --shapes shape and exit")
    p.add_argument("--ncu-table", metavar="CSV",
                   help="(for scripts/ncu_profile.sh) print the table of an `ncu --csv --page raw` "
                        "export and exit")
    return p


def _parse_shapes(text: str, group: int) -> list[Shape]:
    shapes: list[Shape] = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        key = item.lower()
        if key == "all":
            names = list(PRESETS)
        elif key in PRESETS:
            names = [key]
        else:
            names = []
        if names:
            shapes += [Shape(n, K, N, group) for n in names for K, N in PRESETS[n]]
            continue
        body, _, g = key.partition(":")
        try:
            K, N = (int(v) for v in body.split("x"))
            G = int(g) if g else group
        except ValueError:
            raise ValueError(f"--shapes: {item!r} is neither a preset ({', '.join(PRESETS)}, all) "
                             "nor KxN / KxN:G") from None
        shapes.append(Shape("custom", K, N, G))
    if not shapes:
        raise ValueError("--shapes: no shape given")
    for s in shapes:
        if s.K < 1 or s.N < 8 or s.N % 8:
            raise ValueError(f"--shapes: {s.label}: K must be >= 1 and N a positive multiple of 8")
        if s.G < 1 or s.K % s.G:
            raise ValueError(f"--shapes: {s.label}: group size {s.G} does not divide K={s.K} "
                             "(use --group, or KxN:G)")
    seen, unique = set(), []
    for s in shapes:
        if (s.K, s.N, s.G) not in seen:
            seen.add((s.K, s.N, s.G))
            unique.append(s)
    return unique


def _default_device() -> str:
    from . import cuda_available

    try:
        import torch

        if cuda_available() and torch.cuda.is_available():
            return "cuda"
    except Exception:
        pass
    return "cpu"


@dataclass
class Config:
    device: str  # "cpu" or "cuda:N"
    shapes: list
    kernels: list
    args: argparse.Namespace
    prefill_tokens: tuple


def _resolve(args, parser) -> Config:
    device = args.device or _default_device()
    kind = "cpu" if device == "cpu" else "cuda"
    if kind == "cuda" and not (device == "cuda" or device.startswith("cuda:")):
        parser.error(f"--device must be cuda, cuda:N or cpu; got {device!r}")
    try:
        shapes = _parse_shapes(args.shapes, args.group)
    except ValueError as exc:
        parser.error(str(exc))
    if args.kernels is None:
        kernels = list(DEFAULT_KERNELS[kind])
    else:
        kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
        bad = [k for k in kernels if k not in KNOWN_KERNELS[kind]]
        if bad:
            parser.error(f"--kernels: {', '.join(bad)} not available on {kind}; "
                         f"choose from {', '.join(KNOWN_KERNELS[kind])}")
        kernels = list(dict.fromkeys(kernels))
    if args.trials < 1 or args.runs < 1:
        parser.error("--trials and --runs must be >= 1")
    try:
        tokens = tuple(int(t) for t in args.prefill_tokens.split(",") if t.strip())
    except ValueError:
        parser.error(f"--prefill-tokens: integers expected; got {args.prefill_tokens!r}")
    try:
        hk, hn = (int(v) for v in args.host_shape.lower().split("x"))
        if hk < 1 or hn < 8 or hn % 8:
            raise ValueError
    except ValueError:
        parser.error(f"--host-shape: KxN with N a multiple of 8 expected; got {args.host_shape!r}")
    args.host_kn = (hk, hn)
    if kind == "cuda":
        from . import cuda_available

        try:
            import torch
        except ImportError:
            parser.error("--device cuda needs torch (pip install torch)")
        if not torch.cuda.is_available():
            parser.error("--device cuda: torch sees no CUDA device")
        if not cuda_available():
            parser.error("--device cuda: this build of awq_fast_dequant has no CUDA backend "
                         "(rebuild with nvcc on PATH, without AWQ_FAST_DEQUANT_NO_CUDA)")
        if device == "cuda":
            device = f"cuda:{torch.cuda.current_device()}"
    return Config(device, shapes, kernels, args, tokens)


# --------------------------------------------------------------------------
# Progress bar
# --------------------------------------------------------------------------


class _NoBar:
    def update(self, n=1):
        pass

    def set_description_str(self, text):
        pass

    def write(self, text):
        print(text, file=sys.stderr, flush=True)

    def close(self):
        pass


def _progress(total: int, enabled: bool):
    if not enabled:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()

    class _Bar:
        def __init__(self):
            self.bar = tqdm(total=total, unit="step", dynamic_ncols=True, file=sys.stderr)

        def update(self, n=1):
            self.bar.update(n)

        def set_description_str(self, text):
            self.bar.set_description_str(text)

        def write(self, text):
            tqdm.write(text, file=sys.stderr)

        def close(self):
            self.bar.close()

    return _Bar()


# --------------------------------------------------------------------------
# Devices
# --------------------------------------------------------------------------


class CudaBackend:
    kind = "cuda"

    def __init__(self, device: str, flush_mib):
        import torch

        self.torch = torch
        self.device = torch.device(device)
        torch.cuda.set_device(self.device)
        props = torch.cuda.get_device_properties(self.device)
        self.l2_bytes = int(getattr(props, "L2_cache_size", 0) or 0)
        flush = (flush_mib << 20) if flush_mib else max(256 << 20, 2 * self.l2_bytes)
        self.timer = CudaTimer(torch, self.device, flush)

    def case(self, shape: Shape, dtype: str, inputs) -> Case:
        return cuda_case(self.torch, self.device, shape.K, shape.N, shape.G, dtype, inputs)

    def check(self, ref, dtype: str):
        return TorchCheck(self.torch, ref, dtype, self.device)

    @staticmethod
    def poison(case: Case):
        return lambda: case.out.fill_(POISON)

    def release(self):
        self.torch.cuda.synchronize(self.device)
        self.torch.cuda.empty_cache()


class CpuBackend:
    kind = "cpu"

    def __init__(self, flush_mib):
        self.timer = CpuTimer((flush_mib or 256) << 20)

    def case(self, shape: Shape, dtype: str, inputs) -> Case:
        qw, qz, sc = inputs
        out = np.empty((shape.K, shape.N), dtype=numpy_dtype(dtype))
        return Case(K=shape.K, N=shape.N, group_size=shape.G, dtype=dtype, device="cpu",
                    qweight=qw, qzeros=qz, scales=sc, out=out)

    def check(self, ref, dtype: str):
        return NumpyCheck(ref, dtype)

    @staticmethod
    def poison(case: Case):
        return lambda: case.out.fill(POISON)

    def release(self):
        pass


# --------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------


def _role(name: str, registered: dict) -> str:
    if name in registered:
        return "registered"
    if name in PEERS:
        return "peer"
    if name in BASELINES:
        return "baseline"
    return "ours"


class Run:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.args = cfg.args
        self.kind = "cpu" if cfg.device == "cpu" else "cuda"
        self.registered = registered_impls(os.environ)
        self.rng = np.random.default_rng(cfg.args.seed)
        self.backend = None
        self.torch = None
        self.peers: dict = {}
        self.peer_status: dict = {}
        self.bar = _NoBar()
        self.result: dict = {
            "schema": SCHEMA,
            "complete": False,
            "argv": None,
            "config": {
                "device": cfg.device,
                "shapes": [{"model": s.model, "K": s.K, "N": s.N, "G": s.G} for s in cfg.shapes],
                "group": cfg.args.group,
                "dtype": cfg.args.dtype,
                "kernels": list(cfg.kernels),
                "registered": sorted(self.registered),
                "trials": cfg.args.trials,
                "runs": cfg.args.runs,
                "seed": cfg.args.seed,
                "sweep": bool(cfg.args.sweep),
                "prefill": bool(cfg.args.prefill),
                "prefill_tokens": list(cfg.prefill_tokens),
                "main": not cfg.args.no_main,
                "host": not cfg.args.no_host,
                "unstable_threshold": UNSTABLE_GAP,
            },
            "environment": None,
            "peers": {},
            "copy_bandwidth": None,
            "launch_floor": None,
            "shapes": [],
            "host_overhead": None,
            "plots": [],
            "summary": None,
        }

    # -- helpers ---------------------------------------------------------

    def say(self, text: str):
        self.bar.write(text)

    def _impl_names(self) -> list[str]:
        names = [k for k in self.cfg.kernels if k not in PEERS or k in self.peers]
        return names + [n for n in self.registered if n not in names]

    def _build_impls(self, case: Case, names) -> dict[str, Impl]:
        from . import dequantize, smart_dequantize

        qw, qz, sc, out, G = case.qweight, case.qzeros, case.scales, case.out, case.group_size
        poison = self.backend.poison(case)
        impls = {}
        for name in names:
            if name in CUDA_KERNELS or name == "cpu":
                fn = (lambda k=name: dequantize(qw, qz, sc, group_size=G, out=out, kernel=k))
                impls[name] = Impl(name, fn, True, poison, f"dequantize(kernel={name!r}, out=)")
            elif name == "smart":
                impls[name] = Impl(name, lambda: smart_dequantize(qw, qz, sc, group_size=G, out=out),
                                   True, poison, "smart_dequantize(out=)")
            elif name == "torch":
                import torch

                t_in = case.torch_inputs()
                t_dt = getattr(torch, case.dtype)
                impls[name] = Impl(name, lambda a=t_in, d=t_dt: torch_dequantize(*a, G, d), True,
                                   None, "plain PyTorch formula (allocates)")
            elif name == "numpy":
                n_dt = numpy_dtype(case.dtype)
                impls[name] = Impl(name, lambda d=n_dt: numpy_dequantize(qw, qz, sc, G, d), True,
                                   None, "vectorised NumPy formula (allocates)")
            elif name in PEERS:
                op = self.peers[name]
                impls[name] = Impl(name, lambda op=op: op(qw, sc, qz), False, None,
                                   self.peer_status[name].get("op", name))
            elif name in self.registered:
                fn, ours = self.registered[name]
                impls[name] = Impl(name, lambda fn=fn: fn(case), ours, poison, "registered")
        return impls

    def _time(self, impls, check):
        """Warm every implementation up, then time the trials of those that
        ran: (warm-up records, trial records, run orders)."""
        warm = warm_up(impls, check, self.backend.timer)
        raw, orders = run_trials(impls, trials=self.args.trials, runs=self.args.runs,
                                 timer=self.backend.timer, rng=self.rng, check=check,
                                 progress=self.bar, skip={n for n, w in warm.items() if w["error"]})
        return warm, raw, orders

    def _record(self, impls, warm, raw, bytes_, copy_gbps, registered) -> dict:
        recs = {}
        for name, impl in impls.items():
            r = raw.get(name, {"samples_us": [], "mismatches": [], "notes": [], "error": None})
            w = warm.get(name, {})
            error = w.get("error") or r.get("error")
            stats = summarize(r["samples_us"])
            median = stats.get("median_us")
            gbps = bytes_ / (median * 1e3) if median else None
            mism = list(r["mismatches"])
            notes = list(r["notes"]) + ([w["note"]] if w.get("note") else [])
            bitexact = None
            if error is None and (mism or w):
                bitexact = not any(mism) and not w.get("mismatches")
            recs[name] = {
                "role": _role(name, registered),
                "ours": impl.ours,
                "call": impl.note,
                "warmup": w,
                "samples_us": r["samples_us"],
                "mismatches": mism,
                "notes": sorted(set(notes)),
                "error": error,
                "stats": stats,
                "gbps": gbps,
                "pct_copy": (100.0 * gbps / copy_gbps) if gbps and copy_gbps else None,
                "bitexact": bitexact,
            }
        return recs

    def _smart_pick(self, shape: Shape) -> dict | None:
        from . import build_info, cache_entries

        try:
            entries = cache_entries()
            gen = build_info()["kernel_generations"][self.kind]  # the entries this build uses
        except Exception:
            return None
        dtype = self.args.dtype
        match = [e for e in entries
                 if e.get("K") == shape.K and e.get("N") == shape.N and e.get("G") == shape.G
                 and e.get("scales_dtype") == dtype and e.get("out_dtype") == dtype
                 and str(e.get("device", "")).startswith("cpu") == (self.kind == "cpu")
                 and e.get("gen") == gen]
        return dict(match[-1]) if match else None

    # -- stages ------------------------------------------------------------

    def setup(self):
        args = self.args
        if self.kind == "cuda":
            self.backend = CudaBackend(self.cfg.device, args.flush_mib)
            self.torch = self.backend.torch
        else:
            self.backend = CpuBackend(args.flush_mib)
        for name in PEERS:
            if name not in self.cfg.kernels:
                continue
            op, status = load_peer(name)
            self.peer_status[name] = status
            if op is not None:
                self.peers[name] = op
            print(f"{name}: {status['status']}", file=sys.stderr, flush=True)
        self.result["peers"] = self.peer_status
        self.result["environment"] = report.environment(
            self.cfg.device, self.torch, getattr(self.backend, "device", None))
        self.result["config"]["flush_bytes"] = self.backend.timer.flush_bytes

    def total_steps(self) -> int:
        a = self.args
        per_shape = 0
        if not a.no_main:
            per_shape += a.trials * len(self._impl_names())
        if self.kind == "cuda":
            if a.sweep:
                per_shape += a.trials * (len(SWEEP_V3_BLOCKS) + len(SWEEP_V4_BLOCKS) + 2)
            if a.prefill:
                per_shape += a.trials * 3 * len(self.cfg.prefill_tokens)
        steps = per_shape * len(self.cfg.shapes)
        if self.kind == "cuda":
            steps += 2  # copy bandwidth, start and end
            if self._wants_floor():
                steps += a.trials
            if not a.no_host:
                steps += len(HOST_CASES)
        return steps

    def _wants_floor(self) -> bool:
        return bool(self.cfg.shapes) and (not self.args.no_main or self.args.sweep)

    def launch_floor(self) -> dict:
        """v4 on FLOOR_SHAPE, timed and checked like a shape's implementations."""
        from . import dequantize, reference

        shape, dtype = FLOOR_SHAPE, self.args.dtype
        self.bar.set_description_str(f"launch floor ({shape.label})")
        inputs = make_inputs(shape.K, shape.N, shape.G, dtype, self.args.seed)
        check = self.backend.check(reference.dequantize(*inputs, group_size=shape.G), dtype)
        case = self.backend.case(shape, dtype, inputs)
        impl = Impl("v4", lambda c=case: dequantize(c.qweight, c.qzeros, c.scales,
                                                    group_size=c.group_size, out=c.out, kernel="v4"),
                    True, self.backend.poison(case), "dequantize(kernel='v4', out=) of a 1x8 layer")
        warm, raw, _ = self._time({"v4": impl}, check)
        rec = self._record({"v4": impl}, warm, raw, bytes_moved(shape.K, shape.N, shape.G, dtype),
                           None, {})["v4"]
        del case, check
        return {"K": shape.K, "N": shape.N, "G": shape.G, "call": rec["call"],
                "samples_us": rec["samples_us"], "stats": rec["stats"],
                "median_us": rec["stats"].get("median_us"), "error": rec["error"],
                "bitexact": rec["bitexact"]}

    def copy_bandwidth(self, when: str):
        bw = cuda_copy_bandwidth(self.torch, self.backend.device, self.backend.timer,
                                 self.args.copy_mib << 20, runs=10)
        bw["when"] = when
        self.bar.update(1)
        return bw

    def run_shape(self, shape: Shape, copy_gbps):
        args = self.args
        dtype = args.dtype
        entry = {"model": shape.model, "label": shape.label, "K": shape.K, "N": shape.N,
                 "G": shape.G, "dtype": dtype, "bytes": bytes_moved(shape.K, shape.N, shape.G, dtype)}
        self.result["shapes"].append(entry)
        self.bar.set_description_str(f"{shape.model} {shape.label}: reference")
        inputs = make_inputs(shape.K, shape.N, shape.G, dtype, args.seed)
        case = self.backend.case(shape, dtype, inputs)
        need_ref = not args.no_main or (self.kind == "cuda" and args.sweep)
        check = None
        if need_ref:
            from . import reference

            t0 = time.perf_counter()
            ref = reference.dequantize(*inputs, group_size=shape.G)
            entry["reference_s"] = time.perf_counter() - t0
            check = self.backend.check(ref, dtype)
            del ref
        del inputs

        if self.kind == "cpu":
            bw = cpu_copy_bandwidth(shape.K * shape.N * DTYPE_BYTES[dtype], self.backend.timer,
                                    runs=max(args.runs, 5))
            entry["copy_bandwidth"] = bw
            copy_gbps = bw["gbps"]
        entry["copy_gbps"] = copy_gbps

        if not args.no_main:
            self.bar.set_description_str(f"{shape.model} {shape.label}")
            impls = self._build_impls(case, self._impl_names())
            warm, raw, orders = self._time(impls, check)
            entry["orders"] = orders
            entry["implementations"] = self._record(impls, warm, raw, entry["bytes"], copy_gbps,
                                                    self.registered)
            entry["flagged"] = any((r["stats"] or {}).get("unstable")
                                   for r in entry["implementations"].values())
            entry["smart_pick"] = self._smart_pick(shape)
            for name, rec in entry["implementations"].items():
                if rec["error"]:
                    self.say(f"{shape.label}: {name}: {rec['error']}")
                elif rec["bitexact"] is False:
                    self.say(f"{shape.label}: {name}: not bit-exact")
        if self.kind == "cuda" and args.sweep:
            entry["sweep"] = self.sweep(shape, case, check, entry["bytes"], copy_gbps)
        if self.kind == "cuda" and args.prefill:
            entry["prefill"] = self.prefill(shape, case)
        del case, check
        self.backend.release()

    def sweep(self, shape: Shape, case: Case, check, bytes_, copy_gbps) -> dict:
        from . import dequantize, smart_dequantize

        qw, qz, sc, out, G = case.qweight, case.qzeros, case.scales, case.out, case.group_size
        poison = self.backend.poison(case)
        impls = {}
        for kernel, blocks in (("v3", SWEEP_V3_BLOCKS), ("v4", SWEEP_V4_BLOCKS)):
            for bs in blocks:
                impls[f"{kernel}/{bs}"] = Impl(
                    f"{kernel}/{bs}",
                    lambda k=kernel, b=bs: dequantize(qw, qz, sc, group_size=G, out=out, kernel=k,
                                                      block_size=b),
                    True, poison, f"dequantize(kernel={kernel!r}, block_size={bs}, out=)")
        impls["v4/default"] = Impl(
            "v4/default", lambda: dequantize(qw, qz, sc, group_size=G, out=out, kernel="v4"),
            True, poison, "dequantize(kernel='v4', out=)")
        impls["smart"] = Impl("smart", lambda: smart_dequantize(qw, qz, sc, group_size=G, out=out),
                              True, poison, "smart_dequantize(out=)")
        self.bar.set_description_str(f"{shape.model} {shape.label}: sweep")
        warm, raw, orders = self._time(impls, check)
        cands = self._record(impls, warm, raw, bytes_, copy_gbps, {})
        timed = sorted(((r["stats"]["median_us"], n) for n, r in cands.items()
                        if n != "smart" and r["stats"].get("median_us") and r["bitexact"]))
        out_rec = {"candidates": cands, "orders": orders, "smart_pick": self._smart_pick(shape),
                   "winner": None, "winner_us": None, "runner_up": None, "runner_up_us": None,
                   "margin_runner_up_pct": None, "margin_v4_default_pct": None,
                   "smart_us": None, "smart_vs_winner_pct": None}
        if timed:
            best_us, best = timed[0]
            out_rec.update(winner=best, winner_us=best_us)
            if len(timed) > 1:
                out_rec.update(runner_up=timed[1][1], runner_up_us=timed[1][0],
                               margin_runner_up_pct=100.0 * (timed[1][0] - best_us) / best_us)
            default_us = cands["v4/default"]["stats"].get("median_us")
            if default_us:
                out_rec["margin_v4_default_pct"] = 100.0 * (default_us - best_us) / best_us
            smart_us = cands["smart"]["stats"].get("median_us")
            if smart_us:
                out_rec.update(smart_us=smart_us,
                               smart_vs_winner_pct=100.0 * (smart_us - best_us) / best_us)
        return out_rec

    def prefill(self, shape: Shape, case: Case) -> list[dict]:
        from . import smart_dequantize

        torch = self.torch
        dt = getattr(torch, self.args.dtype)
        qw, qz, sc, out, G = case.qweight, case.qzeros, case.scales, case.out, case.group_size
        gen = torch.Generator(device=self.backend.device)
        gen.manual_seed(self.args.seed)
        dense = (torch.randn(shape.K, shape.N, device=self.backend.device, generator=gen) * 0.02).to(dt)
        results = []
        for M in self.cfg.prefill_tokens:
            self.bar.set_description_str(f"{shape.model} {shape.label}: prefill M={M}")
            x = torch.randn(M, shape.K, device=self.backend.device, generator=gen).to(dt)

            def deq():
                return smart_dequantize(qw, qz, sc, group_size=G, out=out)

            def deq_mm(x=x):
                smart_dequantize(qw, qz, sc, group_size=G, out=out)
                return torch.matmul(x, out)

            def mm(x=x, w=dense):
                return torch.matmul(x, w)

            impls = {n: Impl(n, f, True, None, n) for n, f in
                     (("dequant", deq), ("dequant+matmul", deq_mm), ("matmul", mm))}
            warm, raw, orders = self._time(impls, None)
            stats = {n: summarize(raw[n]["samples_us"]) for n in impls}
            errors = {n: warm[n]["error"] or raw[n]["error"] for n in impls
                      if warm[n]["error"] or raw[n]["error"]}
            t_dm = stats["dequant+matmul"].get("median_us")
            t_mm = stats["matmul"].get("median_us")
            results.append({
                "M": M, "stats": stats, "errors": errors, "orders": orders,
                "samples_us": {n: raw[n]["samples_us"] for n in impls},
                "fraction": (t_dm - t_mm) / t_dm if t_dm and t_mm else None,
                "matmul_tflops": 2.0 * M * shape.K * shape.N / (t_mm * 1e6) if t_mm else None,
            })
            del x
        del dense
        return results

    def host(self) -> dict:
        from . import _C, cache_stats, dequantize, smart_dequantize

        torch = self.torch
        args = self.args
        K, N = args.host_kn
        G = args.group if K % args.group == 0 else K
        dtype = args.dtype
        self.bar.set_description_str(f"host overhead {K}x{N}")
        case = self.backend.case(Shape("host", K, N, G), dtype, make_inputs(K, N, G, dtype, args.seed))
        qw, qz, sc, out = case.qweight, case.qzeros, case.scales, case.out
        dt = getattr(torch, dtype)
        dev_index = qw.device.index
        stream = torch.cuda.current_stream(qw.device).cuda_stream
        # The floor first: an empty kernel launched the way dequantize launches, with
        # no arguments to read. Each case's distance from it is its own host work.
        cases = dict(zip(HOST_CASES, (
            (lambda: _C._empty_launch(dev_index, stream), HOST_CALLS_OURS),
            (lambda: dequantize(qw, qz, sc, group_size=G, out=out), HOST_CALLS_OURS),
            (lambda: dequantize(qw, qz, sc, group_size=G), HOST_CALLS_OURS),
            (lambda: smart_dequantize(qw, qz, sc, group_size=G, out=out), HOST_CALLS_OURS),
            (lambda: torch_dequantize(qw, qz, sc, G, dt), HOST_CALLS_TORCH),
        )))
        before = report._safe(cache_stats)
        measured = host_overhead(torch, self.backend.device, cases, repeats=args.host_repeats,
                                 sleep_cycles=HOST_SLEEP_CYCLES, progress=self.bar)
        after = report._safe(cache_stats)
        del case
        self.backend.release()
        return {"label": f"{K}x{N}", "K": K, "N": N, "G": G, "dtype": dtype,
                "method": "calls timed with perf_counter_ns while torch.cuda._sleep keeps the "
                          "GPU busy; median over repeats",
                "cases": measured, "cache_stats_before": before, "cache_stats_after": after}

    def finish(self) -> int:
        failures = []
        inexact = []
        for s in self.result["shapes"]:
            groups = [("", s.get("implementations", {}))]
            if s.get("sweep"):
                groups.append(("sweep ", s["sweep"]["candidates"]))
            for section, recs in groups:
                for name, rec in recs.items():
                    if not rec["ours"]:
                        continue
                    if rec["error"]:
                        failures.append(f"{s['label']}: {section}{name}: {rec['error']}")
                    elif rec["bitexact"] is not True:
                        failures.append(f"{s['label']}: {section}{name}: not bit-exact")
                        inexact.append(f"{s['label']}: {section}{name}")
            for p in s.get("prefill") or []:
                for name, err in p["errors"].items():
                    failures.append(f"{s['label']}: prefill M={p['M']} {name}: {err}")
        floor = self.result.get("launch_floor")
        if floor and floor["error"]:
            failures.append(f"launch floor: {floor['error']}")
        elif floor and floor["bitexact"] is not True:
            failures.append("launch floor: not bit-exact")
            inexact.append("launch floor")
        host = self.result.get("host_overhead")
        if host:
            for name, e in host["cases"].items():
                if e.get("error"):
                    failures.append(f"host overhead {name}: {e['error']}")
        peers_inexact = sorted({n for s in self.result["shapes"]
                                for n, r in s.get("implementations", {}).items()
                                if not r["ours"] and r["bitexact"] is False})
        flagged = [s["label"] for s in self.result["shapes"] if s.get("flagged")]
        code = 1 if failures else 0
        self.result["summary"] = {
            "exit_code": code,
            "all_ours_bitexact": not inexact,
            "ours_not_bitexact": inexact,
            "failures": failures,
            "peers_not_bitexact": peers_inexact,
            "flagged_shapes": flagged,
        }
        return code

    def apply_copy(self):
        """Fill GB/s share of the copy once both CUDA copy measurements exist."""
        bw = self.result.get("copy_bandwidth")
        if not bw:
            return
        samples = [x for m in bw["measurements"] for x in m["samples_us"]]
        median = statistics.median(samples)
        bw["median_us"] = median
        bw["gbps"] = bw["measurements"][0]["bytes_moved"] / (median * 1e3)
        for s in self.result["shapes"]:
            s["copy_gbps"] = bw["gbps"]
            recs = list(s.get("implementations", {}).values())
            recs += list((s.get("sweep") or {}).get("candidates", {}).values())
            for r in recs:
                if r.get("gbps"):
                    r["pct_copy"] = 100.0 * r["gbps"] / bw["gbps"]
            floor = (self.result.get("launch_floor") or {}).get("median_us")
            if floor:
                s["floor_model_us"] = floor + s["bytes"] / (bw["gbps"] * 1e3)
                for r in recs:
                    median = (r.get("stats") or {}).get("median_us")
                    if median:
                        r["over_floor_us"] = median - s["floor_model_us"]

    def execute(self) -> int:
        self.setup()
        self.bar = _progress(self.total_steps(), not self.args.no_progress)
        try:
            copy_gbps = None
            if self.kind == "cuda":
                first = self.copy_bandwidth("start")
                self.result["copy_bandwidth"] = {"measurements": [first]}
                copy_gbps = first["gbps"]
                if self._wants_floor():
                    self.result["launch_floor"] = self.launch_floor()
            for shape in self.cfg.shapes:
                self.run_shape(shape, copy_gbps)
            if self.kind == "cuda":
                if not self.args.no_host:
                    self.result["host_overhead"] = self.host()
                self.result["copy_bandwidth"]["measurements"].append(self.copy_bandwidth("end"))
                self.apply_copy()
            else:
                self.result["host_overhead"] = {"skipped": "CUDA only", "cases": {}}
                if self.args.sweep:
                    self.say("sweep: skipped (CUDA only)")
                if self.args.prefill:
                    self.say("prefill: skipped (CUDA only)")
            self.result["complete"] = True
        finally:
            self.bar.close()
        return self.finish()


def _json_default(obj):
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return str(obj)


# An array whose elements hold no brackets or braces (numbers, names): json.dumps
# never writes a raw newline inside a string, so "[" + newline is structural.
_FLAT_ARRAY = re.compile(r"\[\n\s*((?:[^\[\]{}\n]+\n\s*)*?[^\[\]{}\n]+)\n\s*\]")


def to_json(result: dict) -> str:
    """Indented JSON with every flat array (timings, orders) on one line."""
    text = json.dumps(result, indent=1, default=_json_default)
    return _FLAT_ARRAY.sub(lambda m: "[" + re.sub(r"\n\s*", " ", m.group(1)) + "]", text)


def write_json(result: dict, path: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(to_json(result) + "\n")
    os.replace(tmp, path)


def print_report(result: dict, file=sys.stdout) -> None:
    cfg = result["config"]
    env = result.get("environment") or {}
    where = (env.get("gpu") or {}).get("name") if cfg["device"] != "cpu" else env.get("cpu")
    head = (f"awq_fast_dequant bench: {where} ({cfg['device']}), {cfg['dtype']}, "
            f"{cfg['trials']} trials x {cfg['runs']} runs, cache flush {cfg.get('flush_bytes', 0) >> 20} MiB")
    print("\n" + head, file=file)
    bw = result.get("copy_bandwidth")
    if bw and bw.get("gbps"):
        print(f"device-to-device copy: {bw['gbps']:.0f} GB/s (median of "
              f"{sum(len(m['samples_us']) for m in bw['measurements'])}, "
              f"{bw['measurements'][0]['buffer_bytes'] >> 20} MiB read + written, start and end "
              f"of the run)", file=file)
    floor = result.get("launch_floor") or {}
    if floor.get("median_us"):
        print(f"launch floor: {floor['median_us']:.2f} us (v4 on a 1x8 layer, timed like the "
              f"shapes); a layer's floor model = that + its bytes at the copy bandwidth",
              file=file)
    for name, st in (result.get("peers") or {}).items():
        print(f"{name}: {st['status']}", file=file)
    for title, text in (("", report.main_table(result)),
                        ("Block-size sweep", report.sweep_table(result)),
                        ("Prefill", report.prefill_table(result)),
                        ("Host overhead", report.host_table(result))):
        if text:
            print(("\n" + title + "\n" if title else "\n") + text, file=file)
    problems = report.problems_text(result)
    if problems:
        print("\nProblems:\n" + problems, file=file)
    summary = result.get("summary") or {}
    if summary:
        verdict = ("all of ours bit-exact on every trial" if summary.get("exit_code") == 0
                   else f"FAILED: {len(summary.get('failures', []))} problem(s)")
        print(f"\nresult: {verdict}", file=file)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m awq_fast_dequant bench ARGS` (argv = ARGS)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits on --help and on errors
        return int(exc.code or 0)

    if args.ncu_table:
        from ._bench_ncu import table_main

        kernels = [k.strip() for k in (args.kernels or "v1,v2,v3,v4").split(",") if k.strip()]
        return table_main(args.ncu_table, kernels, args.json)

    try:
        cfg = _resolve(args, parser)
    except SystemExit as exc:
        return int(exc.code or 0)

    if args.ncu_driver:
        from ._bench_ncu import driver

        kernels = [k for k in cfg.kernels if k in CUDA_KERNELS]
        if cfg.device == "cpu" or not kernels:
            print("--ncu-driver needs --device cuda and --kernels among v1..v4", file=sys.stderr)
            return 2
        return driver(cfg.shapes[0], args.dtype, kernels, cfg.device)

    run = Run(cfg)
    run.result["argv"] = argv
    code = 1
    try:
        code = run.execute()
    except KeyboardInterrupt:
        run.result["summary"] = {"exit_code": 130, "interrupted": True}
        if args.json:
            write_json(run.result, args.json)
            print(f"partial results written to {args.json}", file=sys.stderr)
        raise
    except Exception:
        tb = traceback.format_exc()
        print(tb, file=sys.stderr)
        try:
            run.finish()
        except Exception:
            run.result["summary"] = {}
        run.result["summary"]["exit_code"] = 1
        run.result["summary"]["crash"] = tb
        code = 1
    if args.plot:
        try:
            paths, reason = report.write_plots(run.result, args.plot)
        except Exception as exc:  # a plot must never lose the measurements
            paths, reason = [], f"plots failed: {type(exc).__name__}: {exc}"
        run.result["plots"] = paths
        if reason:
            print(reason, file=sys.stderr)
            run.result["plots_note"] = reason
    print_report(run.result)
    if args.json:
        write_json(run.result, args.json)
        print(f"\nJSON: {args.json}")
    if run.result["plots"]:
        print("plots: " + ", ".join(run.result["plots"]))
    return code


if __name__ == "__main__":
    sys.exit(main())
