"""The layer shapes the benchmark times, and the roofline byte count of one."""

from __future__ import annotations

from dataclasses import dataclass

from ..reference import DTYPES  # noqa: F401  (re-exported for the bench modules)
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}

# The layer shapes of DESIGN.md section 6: (K = in_features, N = out_features).
PRESETS = {
    "qwen2.5-1.5b": ((1536, 1536), (1536, 8960), (8960, 1536)),
    "llama-3-8b": ((4096, 4096), (4096, 14336), (14336, 4096)),
    "llama-3-70b": ((8192, 8192), (8192, 28672), (28672, 8192)),
}


@dataclass(frozen=True)
class Shape:
    """One layer: its preset name (or "custom"), K, N and group size G."""

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


def packed_bytes(K: int, N: int, G: int, dtype: str) -> int:
    """qweight K*N/2 + qzeros 4*(K/G)*(N/8) + scales s*(K/G)*N: the quantized layer."""
    s = DTYPE_BYTES[dtype]
    return K * N // 2 + 4 * (K // G) * (N // 8) + s * (K // G) * N


def bytes_moved(K: int, N: int, G: int, dtype: str) -> int:
    """Roofline bytes: the quantized layer (packed_bytes) + out o*K*N."""
    return packed_bytes(K, N, G, dtype) + DTYPE_BYTES[dtype] * K * N


def preset_of(K: int, N: int) -> str:
    """The preset a K x N layer belongs to, or "custom"."""
    return next((name for name, layers in PRESETS.items() if (K, N) in layers), "custom")


def parse_shapes(text: str, group: int) -> list[Shape]:
    """Shapes of a --shapes list: presets, "all", KxN and KxN:G items, in order,
    without repeats; a KxN item that is a preset's layer takes the preset's name.
    Raises ValueError naming the item that is wrong."""
    shapes: list[Shape] = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        key = item.lower()
        names = list(PRESETS) if key == "all" else [key] if key in PRESETS else []
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
        shapes.append(Shape(preset_of(K, N), K, N, G))
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
