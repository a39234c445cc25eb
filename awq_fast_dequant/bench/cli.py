"""The command line of `bench`: options, their defaults per device, and the
resolved `Config` a run works from."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from .shapes import DTYPES, PRESETS, Shape, parse_shapes

KNOWN_KERNELS = {
    "cuda": ("v1", "v2", "v3", "v4", "smart", "torch", "vllm", "sglang"),
    "cpu": ("cpu", "smart", "numpy", "torch"),
}
DEFAULT_KERNELS = {"cuda": KNOWN_KERNELS["cuda"], "cpu": ("cpu", "smart", "numpy")}

# The published method on CUDA (DESIGN.md section 6). The CPU default is
# smaller so that a run with no options ends in well under a minute on a
# two-core machine: the NumPy baseline alone takes about half a second a call
# on a Llama-3-8B layer.
DEFAULTS = {
    "cuda": {"shapes": "qwen2.5-1.5b,llama-3-8b,llama-3-70b", "trials": 15, "runs": 10},
    "cpu": {"shapes": "qwen2.5-1.5b", "trials": 5, "runs": 5},
}

PREFILL_TOKENS = (256, 1024, 4096)

# --linear: the rows M of x and the layers the targets are stated on. On CUDA the
# method's 15 x 10 trials; on the CPU few, so that a run with no options ends
# in about two minutes on a two-core machine (the float16 layer alone is 29 MB
# of packed weights read per call by every row). --quick: a smoke run (CI, the
# sanitizer) that still crosses the fused/dequantize crossover on CUDA.
LINEAR_M = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
LINEAR_DEFAULTS = {
    "cuda": {"shapes": "qwen2.5-1.5b,llama-3-8b,llama-3-70b", "dtype": "float16", "m": LINEAR_M,
             "trials": 15, "runs": 10},
    "cpu": {"shapes": "4096x14336", "dtype": "float16,float32", "m": (1, 2, 4),
            "trials": 3, "runs": 2},
}
LINEAR_QUICK = {
    "cuda": {"shapes": "1536x1536,4096x14336", "dtype": "float16", "m": (1, 16, 128, 1024),
             "trials": 3, "runs": 3},
    "cpu": {"shapes": "1536x1536", "dtype": "float16", "m": (1, 4), "trials": 2, "runs": 2},
}
# The CPU's copy reference for --linear: np.copyto of an array this large.
CPU_LINEAR_COPY_MIB = 256

# The on/off options, in the order --help lists them.
SWITCHES = (
    ("--sweep", "also time v3 and v4 over every block size, against smart_dequantize's pick "
                "(CUDA only; default off)"),
    ("--prefill", "also time dequantize+matmul against a dense matmul (CUDA only; default off)"),
    ("--no-main", "skip the main timing, e.g. to run only --sweep or --prefill (default: run it)"),
    ("--no-host", "skip the host-overhead measurement (CUDA only; default: run it)"),
    ("--no-progress", "no progress bar or step lines on stderr (default: a tqdm bar when tqdm "
                      "is installed, else one line per step)"),
    ("--linear", "benchmark linear() instead of dequantize: the fused, auto and dequant+matmul "
                 "paths against a dense matmul over the rows M of x, checked within the "
                 "tolerance, with the targets' verdict (default off)"),
    ("--quick", "with --linear: a few M and layers, few trials (default off; explicit options "
                "still apply)"),
    ("--strict", "with --linear: a missed target makes the exit status 1 (default: reported "
                 "only)"),
)


def build_parser(prog: str = "awq-fast-dequant bench") -> argparse.ArgumentParser:
    cuda, cpu = DEFAULTS["cuda"], DEFAULTS["cpu"]
    p = argparse.ArgumentParser(
        prog=prog,
        description="Benchmark AWQ dequantization (bit-exact checked) or, with --linear, the "
                    "W4A16 linear layer (checked within its tolerance), on CUDA or the CPU.",
        epilog="Exit status: 0 all ran and all of ours bit-exact (--linear: within the "
               "tolerance, and with --strict every target met), 1 otherwise, 2 bad arguments. "
               "Method and column meanings: docs/BENCHMARKS.md.")
    p.add_argument("--device", default=None,
                   help="cuda, cuda:N or cpu (default: cuda when this build and torch see a GPU, "
                        "else cpu)")
    p.add_argument("--shapes", default=None,
                   help="comma list of presets (" + ", ".join(PRESETS) + ", all) and KxN items "
                        "(K = in_features = qweight rows, N = out_features; KxN:G sets G for one "
                        f"shape); default on cuda: {cuda['shapes']} (9 shapes); on the cpu: "
                        f"{cpu['shapes']} (3 shapes)")
    p.add_argument("--group", type=int, default=128, help="group size G (default 128)")
    p.add_argument("--dtype", default=None,
                   help="scales and output dtype: " + ", ".join(DTYPES) + "; with --linear a "
                        "comma list, e.g. float16,bfloat16 (default float16; with --linear on "
                        "the cpu: " + LINEAR_DEFAULTS["cpu"]["dtype"] + ")")
    p.add_argument("--kernels", default=None,
                   help="comma list; cuda: " + ",".join(KNOWN_KERNELS["cuda"]) + " (default all; "
                        "vllm and sglang run when installed); cpu: " + ",".join(KNOWN_KERNELS["cpu"])
                        + " (default " + ",".join(DEFAULT_KERNELS["cpu"]) + ")")
    p.add_argument("--trials", type=int, default=None,
                   help=f"trials per shape (default {cuda['trials']} on cuda, {cpu['trials']} on "
                        "the cpu)")
    p.add_argument("--runs", type=int, default=None,
                   help=f"timed runs per trial (default {cuda['runs']} on cuda, {cpu['runs']} on "
                        "the cpu)")
    p.add_argument("--json", metavar="PATH",
                   help="write every raw timing and the environment here (default: no JSON)")
    p.add_argument("--plot", metavar="PATH",
                   help="PNG prefix (PATH_gbps.png, PATH_host.png, PATH_prefill.png; --linear: "
                        "PATH_linear_MODEL_KxN_DTYPE.png per layer) or a folder (default: no plots)")
    for flag, text in SWITCHES:
        p.add_argument(flag, action="store_true", help=text)
    p.add_argument("--linear-m", default=None,
                   help="with --linear: comma list of rows M of x (default on cuda: "
                        + ",".join(map(str, LINEAR_M)) + "; on the cpu: "
                        + ",".join(map(str, LINEAR_DEFAULTS["cpu"]["m"])) + "; --quick: "
                        + ",".join(map(str, LINEAR_QUICK["cuda"]["m"])) + " on cuda, "
                        + ",".join(map(str, LINEAR_QUICK["cpu"]["m"])) + " on the cpu)")
    p.add_argument("--prefill-tokens", default=",".join(map(str, PREFILL_TOKENS)),
                   help="token counts M for --prefill (default "
                        + ",".join(map(str, PREFILL_TOKENS)) + ")")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the data and of the run orders (default 0)")
    p.add_argument("--host-shape", default="1536x1536",
                   help="shape of the host-overhead measurement (default 1536x1536)")
    p.add_argument("--host-repeats", type=int, default=7,
                   help="repeats of the host-overhead measurement (default 7)")
    p.add_argument("--flush-mib", type=int, default=None,
                   help="cache-flush buffer written before each timed run "
                        "(default: max(256, 2 x L2) MiB on CUDA, 256 MiB on the CPU)")
    p.add_argument("--copy-mib", type=int, default=None,
                   help="buffer of the copy measurement: device-to-device on CUDA (default 1024), "
                        f"np.copyto with --linear on the cpu (default {CPU_LINEAR_COPY_MIB})")
    return p


@dataclass
class Config:
    """Everything a run needs, resolved and checked."""

    device: str  # "cpu" or "cuda:N"
    shapes: list[Shape]
    kernels: list[str]
    group: int
    dtype: str
    trials: int
    runs: int
    seed: int
    main: bool
    sweep: bool
    prefill: bool
    prefill_tokens: tuple[int, ...]
    host: bool
    host_kn: tuple[int, int]
    host_repeats: int
    flush_mib: int | None
    copy_mib: int
    progress: bool
    json_path: str | None
    plot: str | None
    linear: bool = False
    dtypes: tuple[str, ...] = ()  # --linear: every dtype run; else (dtype,)
    linear_m: tuple[int, ...] = ()
    quick: bool = False
    strict: bool = False

    @property
    def kind(self) -> str:
        return "cpu" if self.device == "cpu" else "cuda"


def default_device() -> str:
    """cuda when this build has the CUDA backend and torch sees a GPU, else cpu.
    A CPU-only build answers without importing torch."""
    from .. import cuda_available

    if not cuda_available():
        return "cpu"
    try:
        import torch

        if torch.cuda.is_available():
            return "cuda"
    except Exception:
        pass
    return "cpu"


def _kernels(text: str | None, kind: str, parser) -> list[str]:
    if text is None:
        return list(DEFAULT_KERNELS[kind])
    kernels = [k.strip() for k in text.split(",") if k.strip()]
    bad = [k for k in kernels if k not in KNOWN_KERNELS[kind]]
    if not kernels:
        parser.error(f"--kernels: no kernel given; choose from {', '.join(KNOWN_KERNELS[kind])}")
    if bad:
        parser.error(f"--kernels: {', '.join(bad)} not available on {kind}; "
                     f"choose from {', '.join(KNOWN_KERNELS[kind])}")
    return list(dict.fromkeys(kernels))


def _host_shape(text: str, parser) -> tuple[int, int]:
    try:
        hk, hn = (int(v) for v in text.lower().split("x"))
        if hk < 1 or hn < 8 or hn % 8:
            raise ValueError
    except ValueError:
        parser.error(f"--host-shape: KxN with N a multiple of 8 expected; got {text!r}")
    return hk, hn


def _cuda_device(device: str, parser) -> str:
    """cuda:N for --device cuda or cuda:N, after checking torch and this build."""
    from .. import cuda_available

    try:
        import torch
    except ImportError:
        parser.error("--device cuda needs torch (pip install torch)")
    if not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")
    if not cuda_available():
        parser.error("--device cuda: this build of awq_fast_dequant has no CUDA backend "
                     "(rebuild with nvcc on PATH, without AWQ_FAST_DEQUANT_NO_CUDA)")
    return f"cuda:{torch.cuda.current_device()}" if device == "cuda" else device


def _dtypes(text: str, linear: bool, parser) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    bad = [n for n in names if n not in DTYPES]
    if not names or bad:
        parser.error(f"--dtype: choose from {', '.join(DTYPES)}; got {text!r}")
    if len(names) > 1 and not linear:
        parser.error(f"--dtype: one dtype without --linear; got {text!r}")
    return names


def _positive_ints(text: str, option: str, parser) -> tuple[int, ...]:
    """A comma list of positive integers, in the order given."""
    try:
        values = tuple(int(t) for t in text.split(",") if t.strip())
        if not values or min(values) < 1:
            raise ValueError
    except ValueError:
        parser.error(f"{option}: positive integers expected; got {text!r}")
    return values


def _linear_settings(args, kind: str, parser) -> dict:
    """Shapes, dtypes, M, trials and runs of a --linear run: the options given,
    else --quick's or the linear defaults of the device."""
    if not args.linear:
        for flag, given in (("--quick", args.quick), ("--strict", args.strict),
                            ("--linear-m", args.linear_m is not None)):
            if given:
                parser.error(f"{flag} applies to --linear runs only")
        return {}
    for flag, given in (("--sweep", args.sweep), ("--prefill", args.prefill),
                        ("--no-main", args.no_main), ("--kernels", args.kernels is not None)):
        if given:
            parser.error(f"{flag} does not apply to --linear (its rows are fixed: fused, auto, "
                         "dequant+matmul, dense); run the dequantize benchmark separately")
    base = (LINEAR_QUICK if args.quick else LINEAR_DEFAULTS)[kind]
    return {
        "shapes": args.shapes or base["shapes"],
        "dtype": args.dtype or base["dtype"],
        "m": base["m"] if args.linear_m is None else tuple(sorted(set(
            _positive_ints(args.linear_m, "--linear-m", parser)))),
        "trials": base["trials"],
        "runs": base["runs"],
    }


def resolve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Config:
    """The Config of parsed arguments; parser.error (SystemExit 2) on a bad one."""
    device = args.device or default_device()
    kind = "cpu" if device == "cpu" else "cuda"
    if kind == "cuda" and not (device == "cuda" or device.startswith("cuda:")):
        parser.error(f"--device must be cuda, cuda:N or cpu; got {device!r}")
    defaults = dict(DEFAULTS[kind], dtype="float16")
    defaults.update(_linear_settings(args, kind, parser))
    try:
        shapes = parse_shapes(args.shapes or defaults["shapes"], args.group)
    except ValueError as exc:
        parser.error(str(exc))
    dtypes = _dtypes(args.dtype or defaults["dtype"], args.linear, parser)
    trials = defaults["trials"] if args.trials is None else args.trials
    runs = defaults["runs"] if args.runs is None else args.runs
    if trials < 1 or runs < 1:
        parser.error(f"--trials and --runs must be >= 1; got {trials} and {runs}")
    tokens = _positive_ints(args.prefill_tokens, "--prefill-tokens", parser)
    for name in ("host_repeats", "copy_mib", "flush_mib"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1; got {value}")
    if args.copy_mib is not None:
        copy_mib = args.copy_mib
    else:
        copy_mib = CPU_LINEAR_COPY_MIB if kind == "cpu" else 1024
    kernels = [] if args.linear else _kernels(args.kernels, kind, parser)
    host_kn = _host_shape(args.host_shape, parser)
    if kind == "cuda":
        device = _cuda_device(device, parser)
    return Config(
        device=device, shapes=shapes, kernels=kernels, group=args.group, dtype=dtypes[0],
        trials=trials, runs=runs, seed=args.seed, main=not (args.no_main or args.linear),
        sweep=args.sweep, prefill=args.prefill, prefill_tokens=tokens, host=not args.no_host,
        host_kn=host_kn, host_repeats=args.host_repeats, flush_mib=args.flush_mib,
        copy_mib=copy_mib, progress=not args.no_progress, json_path=args.json, plot=args.plot,
        linear=args.linear, dtypes=dtypes, linear_m=tuple(defaults.get("m", ())),
        quick=args.quick, strict=args.strict)
