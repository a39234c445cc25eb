"""The state one run's stages share: the configuration, the device backend,
the progress display, the random stream of the run orders, the
implementations beyond the built-in ones, and the result being filled."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .cli import Config
from .devices import make_backend
from .env import environment
from .impls import PEERS, load_peer
from .progress import Silent
from .timing import UNSTABLE_GAP

SCHEMA = "awq_fast_dequant.bench/1"


@dataclass
class Context:
    cfg: Config
    backend: Any  # devices.CudaBackend or devices.CpuBackend
    bar: Silent
    rng: np.random.Generator
    registered: dict  # name -> (fn(case), ours)
    peers: dict  # loaded peers: name -> (op, status)
    result: dict

    @property
    def kind(self) -> str:
        return self.cfg.kind

    @property
    def torch(self):
        return self.backend.torch

    def say(self, text: str) -> None:
        self.bar.write(text)

    def impl_names(self) -> list[str]:
        """The main table's implementations: --kernels (peers only when
        loaded), then the registered ones."""
        names = [k for k in self.cfg.kernels if k not in PEERS or k in self.peers]
        return names + [n for n in self.registered if n not in names]


def new_result(cfg: Config, registered: dict) -> dict:
    """The result record before anything ran; the JSON's top-level fields."""
    return {
        "schema": SCHEMA,
        "complete": False,
        "argv": None,
        "config": {
            "device": cfg.device,
            "shapes": [{"model": s.model, "K": s.K, "N": s.N, "G": s.G} for s in cfg.shapes],
            "group": cfg.group,
            "dtype": cfg.dtype,
            "dtypes": list(cfg.dtypes),
            "kernels": list(cfg.kernels),
            "registered": sorted(registered),
            "trials": cfg.trials,
            "runs": cfg.runs,
            "seed": cfg.seed,
            "sweep": cfg.sweep,
            "prefill": cfg.prefill,
            "prefill_tokens": list(cfg.prefill_tokens),
            "main": cfg.main,
            "host": cfg.host,
            "linear": cfg.linear,
            "linear_m": list(cfg.linear_m),
            "quick": cfg.quick,
            "strict": cfg.strict,
            "unstable_threshold": UNSTABLE_GAP,
        },
        "environment": None,
        "peers": {},
        "copy_bandwidth": None,
        "launch_floor": None,
        "shapes": [],
        "host_overhead": None,
        "linear": None,
        "verdict": None,
        "plots": [],
        "summary": None,
    }


def open_context(cfg: Config, bar: Silent, result: dict, registered: dict) -> Context:
    """Set up the device, load the peers asked for, record the environment."""
    backend = make_backend(cfg.device, cfg.flush_mib)
    peers, status = {}, {}
    for name in PEERS:
        if name not in cfg.kernels:
            continue
        op, status[name] = load_peer(name)
        if op is not None:
            peers[name] = (op, status[name])
        bar.write(f"{name}: {status[name]['status']}")
    result["peers"] = status
    result["environment"] = environment(cfg.device, backend.torch, backend.device)
    result["config"]["flush_bytes"] = backend.timer.flush_bytes
    return Context(cfg=cfg, backend=backend, bar=bar, rng=np.random.default_rng(cfg.seed),
                   registered=registered, peers=peers, result=result)
