"""The prefill stage (--prefill, CUDA): smart_dequantize into a buffer and a
matmul against a dense matmul of the same layer, for each token count M.
This is how engines use a dequantize kernel above a few hundred tokens."""

from __future__ import annotations

from .impls import Impl
from .measure import time_impls
from .shapes import Shape
from .timing import summarize

CALLS = ("dequant", "dequant+matmul", "matmul")


def prefill_layer(ctx, shape: Shape, case) -> list[dict]:
    """One record per M: timings of the three calls, the dequantize share of
    the layer time, and the dense matmul's TFLOP/s."""
    from .. import smart_dequantize

    torch = ctx.torch
    device = ctx.backend.device
    dt = getattr(torch, ctx.cfg.dtype)
    qw, qz, sc, out, G = case.qweight, case.qzeros, case.scales, case.out, case.group_size
    gen = torch.Generator(device=device)
    gen.manual_seed(ctx.cfg.seed)
    dense = (torch.randn(shape.K, shape.N, device=device, generator=gen) * 0.02).to(dt)
    results = []
    for M in ctx.cfg.prefill_tokens:
        ctx.bar.set_description_str(f"{shape.model} {shape.label}: prefill M={M}")
        x = torch.randn(M, shape.K, device=device, generator=gen).to(dt)

        def deq():
            return smart_dequantize(qw, qz, sc, group_size=G, out=out)

        def deq_mm(x=x):
            smart_dequantize(qw, qz, sc, group_size=G, out=out)
            return torch.matmul(x, out)

        def mm(x=x, w=dense):
            return torch.matmul(x, w)

        impls = {n: Impl(n, f, True, None, n) for n, f in zip(CALLS, (deq, deq_mm, mm))}
        warm, raw, orders = time_impls(ctx, impls, None)
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
