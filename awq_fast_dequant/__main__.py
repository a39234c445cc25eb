"""Command line: ``awq-fast-dequant {info,cache,tune,bench}``, also run as
``python -m awq_fast_dequant``.

    info                      what this build holds and sees
    cache path|show|clear     inspect or empty the autotune cache
    tune --shapes 4096x14336,14336x4096 [--group 128] [--dtype float16] [--device cuda|cpu]
                              fill the autotune cache ahead of time
    bench ...                 benchmarks (awq-fast-dequant bench --help)
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys

from .reference import DTYPES

# One program name in every usage line, however the command was started (the
# console script, or python -m, whose argv[0] would read "__main__.py").
PROG = "awq-fast-dequant"


def _shapes(text: str):
    """--shapes: comma list of KxN -> [(K, N)]."""
    shapes = []
    for item in text.split(","):
        item = item.strip().lower()
        if not item:
            continue
        try:
            k, n = item.split("x")
            shapes.append((int(k), int(n)))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"wants KxN items such as 4096x14336, got {item!r}") from None
    if not shapes:
        raise argparse.ArgumentTypeError("is empty")
    return shapes


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < 1:
        raise argparse.ArgumentTypeError(f"wants a positive integer, got {text!r}")
    return value


def _cmd_info(args) -> int:
    import awq_fast_dequant as awq

    info = dict(awq.build_info())
    info["cuda_available"] = awq.cuda_available()
    info["cache_path"] = awq.cache_path()
    print(json.dumps(info, indent=2))
    return 0


def _cmd_cache(args) -> int:
    import awq_fast_dequant as awq

    if args.action == "path":
        print(awq.cache_path())
    elif args.action == "clear":
        awq.clear_cache()
        print(f"cleared {awq.cache_path()}")
    else:
        entries = awq.cache_entries()
        if args.json:
            print(json.dumps(entries, indent=2))
            return 0
        print(f"{awq.cache_path()}: {len(entries)} entries")
        cols = ["device", "gen", "op", "K", "N", "G", "M", "scales_dtype", "out_dtype", "kernel",
                "block_size", "rows", "split", "threads", "chunk", "us"]
        order = sorted(entries, key=lambda e: (e["device"], e["gen"], e["op"], e["K"], e["N"],
                                               e["G"], e["M"]))
        rows = [[f"{e[c]:.2f}" if c == "us" else str(e[c]) for c in cols] for e in order]
        widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c)
                  for i, c in enumerate(cols)]
        print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
        for r in rows:
            print("  ".join(v.ljust(w) for v, w in zip(r, widths)))
    return 0


def _tune_outcome(before: dict, after: dict) -> str:
    """What one smart_dequantize call did, from cache_stats() around it."""
    if after["tunings"] > before["tunings"]:
        return "tuned"
    if after["hits"] > before["hits"]:
        return "cached"
    return "not tuned (AWQ_FAST_DEQUANT_AUTOTUNE=0: the default configuration)"


def _cmd_tune(args) -> int:
    import numpy as np

    import awq_fast_dequant as awq

    device = args.device or ("cuda" if awq.cuda_available() else "cpu")
    if device == "cuda" and not awq.cuda_available():
        args.parser.error("--device cuda, but there is no usable CUDA device (or this build "
                          "is CPU-only)")
    for K, N in args.shapes:
        if K % args.group or N % 8:
            args.parser.error(f"--shapes {K}x{N}: K must be a multiple of --group "
                              f"({args.group}) and N of 8")
    rng = np.random.default_rng(0)
    tuned = 0
    for K, N in args.shapes:
        qw = rng.integers(0, 2**32, size=(K, N // 8), dtype=np.uint32)
        qz = rng.integers(0, 2**32, size=(K // args.group, N // 8), dtype=np.uint32)
        sc = rng.standard_normal((K // args.group, N)).astype(np.float32)
        before = awq.cache_stats()
        if device == "cuda":
            import torch

            dt = getattr(torch, args.dtype)
            tq, tz = (torch.from_numpy(a.view(np.int32)).cuda() for a in (qw, qz))
            ts = torch.from_numpy(sc).to("cuda", dt)
            awq.smart_dequantize(tq, tz, ts)
            torch.cuda.synchronize()
        else:
            from ._frameworks import numpy_dtype

            awq.smart_dequantize(qw, qz, sc.astype(numpy_dtype(args.dtype)))
        outcome = _tune_outcome(before, awq.cache_stats())
        tuned += outcome == "tuned"
        print(f"{K}x{N} G={args.group} {args.dtype} on {device}: {outcome}")
    print(f"tunings this run: {tuned}; cache: {awq.cache_path()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="awq_fast_dequant command line "
                                     "(also run as python -m awq_fast_dequant)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p_info = sub.add_parser("info", help="build and device information, as JSON")
    p_info.set_defaults(run=_cmd_info)

    p_cache = sub.add_parser("cache", help="inspect or clear the autotune cache")
    p_cache.add_argument("action", choices=["path", "show", "clear"],
                         help="path: print the cache file's path; show: list its entries; "
                              "clear: forget every entry, in memory and on disk")
    p_cache.add_argument("--json", action="store_true",
                         help="show: print the entries as JSON (default: a table)")
    p_cache.set_defaults(run=_cmd_cache)

    p_tune = sub.add_parser("tune", help="fill the autotune cache ahead of time")
    p_tune.add_argument("--shapes", required=True, type=_shapes,
                        help="comma list of KxN layer shapes (K = in_features, N = "
                             "out_features), e.g. 4096x14336,14336x4096 (required; no default)")
    p_tune.add_argument("--group", type=_positive_int, default=128,
                        help="group size G (default: 128)")
    p_tune.add_argument("--dtype", default="float16", choices=DTYPES,
                        help="scales and output dtype (default: float16)")
    p_tune.add_argument("--device", choices=["cuda", "cpu"], default=None,
                        help="where to tune (default: cuda when a usable GPU is there, else "
                             "cpu)")
    p_tune.set_defaults(run=_cmd_tune, parser=p_tune)

    from .convert import add_subcommands  # convert, inspect

    add_subcommands(sub, PROG)

    # Listed for --help; its arguments are parsed by the benchmark itself.
    sub.add_parser("bench", help=f"benchmarks (see: {PROG} bench --help)")
    return parser


def _quiet_on_broken_pipe(main):
    """A reader that stops early (`cache show | head`) ends the command quietly with
    the status a process killed by SIGPIPE has (128 + 13), not a traceback."""
    @functools.wraps(main)
    def wrapper(argv=None) -> int:
        try:
            code = main(argv)
            sys.stdout.flush()  # the last buffered lines fail here, not at exit
            return code
        except BrokenPipeError:
            # Python flushes stdout again at exit: point it at /dev/null so that
            # flush has nowhere to fail.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
            return 141
    return wrapper


@_quiet_on_broken_pipe
def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":
        from . import bench

        return bench.main(argv[1:])

    parser = build_parser()
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
