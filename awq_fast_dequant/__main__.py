"""Command line: ``python -m awq_fast_dequant {info,cache,tune,bench}``.

    info                      what this build holds and sees
    cache path|show|clear     inspect or empty the autotune cache
    tune --shapes 4096x14336,14336x4096 [--group 128] [--dtype float16] [--device cuda|cpu]
                              fill the autotune cache ahead of time
    bench ...                 benchmarks (python -m awq_fast_dequant bench --help)
"""

from __future__ import annotations

import argparse
import json
import sys


def _parse_shapes(text: str):
    shapes = []
    for item in text.split(","):
        item = item.strip().lower()
        if not item:
            continue
        try:
            k, n = item.split("x")
            shapes.append((int(k), int(n)))
        except ValueError:
            raise SystemExit(f"error: --shapes wants KxN items such as 4096x14336, got {item!r}")
    if not shapes:
        raise SystemExit("error: --shapes is empty")
    return shapes


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
        cols = ["device", "gen", "K", "N", "G", "scales_dtype", "out_dtype", "kernel",
                "block_size", "rows", "threads", "chunk", "us"]
        order = sorted(entries, key=lambda e: (e["device"], e["gen"], e["K"], e["N"], e["G"]))
        rows = [[f"{e[c]:.2f}" if c == "us" else str(e[c]) for c in cols] for e in order]
        widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c)
                  for i, c in enumerate(cols)]
        print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
        for r in rows:
            print("  ".join(v.ljust(w) for v, w in zip(r, widths)))
    return 0


def _cmd_tune(args) -> int:
    import numpy as np

    import awq_fast_dequant as awq

    device = args.device or ("cuda" if awq.cuda_available() else "cpu")
    if device == "cuda" and not awq.cuda_available():
        raise SystemExit("error: --device cuda but no usable CUDA device (or a CPU-only build)")
    rng = np.random.default_rng(0)
    for K, N in _parse_shapes(args.shapes):
        if K % args.group or N % 8:
            raise SystemExit(f"error: {K}x{N}: K must be a multiple of --group and N of 8")
        qw = rng.integers(0, 2**32, size=(K, N // 8), dtype=np.uint32)
        qz = rng.integers(0, 2**32, size=(K // args.group, N // 8), dtype=np.uint32)
        sc = rng.standard_normal((K // args.group, N)).astype(np.float32)
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
        print(f"tuned {K}x{N} G={args.group} {args.dtype} on {device}")
    stats = awq.cache_stats()
    print(f"tunings this run: {stats['tunings']}; cache: {awq.cache_path()}")
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":
        from . import bench

        return bench.main(argv[1:])

    parser = argparse.ArgumentParser(prog="python -m awq_fast_dequant",
                                     description="awq_fast_dequant command line")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="build and device information")
    p_cache = sub.add_parser("cache", help="inspect or clear the autotune cache")
    p_cache.add_argument("action", choices=["path", "show", "clear"])
    p_cache.add_argument("--json", action="store_true", help="show: print JSON")
    p_tune = sub.add_parser("tune", help="fill the autotune cache ahead of time")
    p_tune.add_argument("--shapes", required=True, help="comma list of KxN, e.g. 4096x14336")
    p_tune.add_argument("--group", type=int, default=128)
    p_tune.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    p_tune.add_argument("--device", choices=["cuda", "cpu"], default=None)
    sub.add_parser("bench", help="benchmarks (see: bench --help)")
    from .convert import add_subcommands  # convert, inspect: each sets args.handler
    add_subcommands(sub, parser.prog)
    args = parser.parse_args(argv)
    if getattr(args, "handler", None):
        return args.handler(args)
    return {"info": _cmd_info, "cache": _cmd_cache, "tune": _cmd_tune}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
