"""The device under test: how a layer's inputs get there, how results are
checked there, how its timer flushes the caches, and how memory is given back."""

from __future__ import annotations

from .cases import Case, cpu_case, cuda_case
from .checks import POISON, NumpyCheck, TorchCheck
from .shapes import Shape
from .timing import CpuTimer, CudaTimer


class CudaBackend:
    kind = "cuda"

    def __init__(self, device: str, flush_mib: int | None):
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

    def release(self) -> None:
        self.torch.cuda.synchronize(self.device)
        self.torch.cuda.empty_cache()


class CpuBackend:
    kind = "cpu"
    torch = None
    device = None

    def __init__(self, flush_mib: int | None):
        self.timer = CpuTimer((flush_mib or 256) << 20)

    def case(self, shape: Shape, dtype: str, inputs) -> Case:
        return cpu_case(shape.K, shape.N, shape.G, dtype, inputs)

    def check(self, ref, dtype: str):
        return NumpyCheck(ref, dtype)

    @staticmethod
    def poison(case: Case):
        return lambda: case.out.fill(POISON)

    def release(self) -> None:
        pass


def make_backend(device: str, flush_mib: int | None):
    """The backend of "cpu" or "cuda:N"."""
    return CpuBackend(flush_mib) if device == "cpu" else CudaBackend(device, flush_mib)
