"""Start a run: Ray, the generator actor, the oracle pool, the controller, the store, and progress output."""

from __future__ import annotations

import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import ray
from ray.exceptions import RayActorError

from oracle.evaluate import OracleConfig
from search.controller import Controller, SearchPlan
from search.generators.actor import GeneratorActor
from search.generators.base import GeneratorError
from search.pool import OraclePool, PoolSpec
from search.store import RunStore
from strategies import make_strategy
from tasks.model import Task


@dataclass
class RunSettings:
    generator: str
    strategy: str
    plan: SearchPlan
    device: str = "cpu"
    gpus: int | None = None  # oracles on GPUs; None: every GPU of the cluster
    address: str | None = None
    max_input_mb: float | None = None
    source: str = "builtin"
    allow_torch: bool = False
    strategy_backend: str = "cuda"
    strategy_options: dict[str, Any] = field(default_factory=dict)  # e.g. agents: {"ambition": "full"}
    compile_baseline: bool | None = None  # None: the oracle's default (on a GPU only)


def versions() -> dict[str, str]:
    import numpy
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__, "ray": ray.__version__,
            "numpy": numpy.__version__, "platform": platform.platform()}


def start_ray(address: str | None, device: str) -> dict[str, Any]:
    """Join a cluster, or start a local one sized for this machine (quick on a 2-core CPU)."""
    if not ray.is_initialized():
        kwargs: dict[str, Any] = dict(include_dashboard=False, logging_level="ERROR", log_to_driver=False)
        if address:
            ray.init(address=address, **kwargs)
        else:
            ray.init(num_cpus=max(2, os.cpu_count() or 2), **kwargs)
    return ray.cluster_resources()


def make_config(settings: RunSettings, tasks: list[Task], generator_info: dict[str, Any], resources: dict[str, Any]) -> dict[str, Any]:
    return {
        "generator": settings.generator, "generator_info": generator_info, "strategy": settings.strategy,
        "strategy_options": {"backend": settings.strategy_backend, **settings.strategy_options}, "plan": asdict(settings.plan),
        "device": settings.device, "gpus": settings.gpus, "max_input_mb": settings.max_input_mb,
        "source": settings.source, "allow_torch": settings.allow_torch, "compile_baseline": settings.compile_baseline,
        "tasks": [t.to_json() for t in tasks], "versions": versions(),
        "hardware": {"cluster": {k: v for k, v in resources.items() if not k.startswith("node:")},
                     "machine": platform.machine(), "cpus": os.cpu_count()},
        "started_at": time.time(), "argv": sys.argv,
    }


def _cause(exc: BaseException) -> str:
    """The last line of an actor's startup error that names an exception: what the user needs to read."""
    lines = [ln.strip() for ln in str(exc).splitlines() if "Error" in ln and ":" in ln]
    return lines[-1][:300] if lines else type(exc).__name__


@dataclass
class Engine:
    generator: Any  # GeneratorActor handle
    pool: OraclePool
    strategy: Any
    generator_info: dict[str, Any]


async def build_engine(settings: RunSettings) -> Engine:
    """The generator actor, the oracle pool (one actor per GPU, or a CPU oracle) and the strategy."""
    resources = ray.cluster_resources()
    generator = GeneratorActor.options(num_cpus=0).remote(settings.generator, {"seed": settings.plan.seed})
    try:
        info = await generator.describe.remote()
    except RayActorError as exc:
        raise GeneratorError(f"the generator {settings.generator} could not start: {_cause(exc)}") from None
    oracles = 1 if settings.device == "cpu" else (settings.gpus or int(resources.get("GPU", 0)))
    if oracles < 1:
        raise RuntimeError("--device cuda but the cluster has no GPU")
    pool = OraclePool(PoolSpec(device=settings.device, oracles=oracles),
                      OracleConfig(device=settings.device, allow_torch=settings.allow_torch,
                                   compile_baseline=settings.compile_baseline))
    return Engine(generator, pool, make_strategy(settings.strategy, settings.strategy_backend, **settings.strategy_options), info)


async def run_search(settings: RunSettings, tasks: list[Task], store: RunStore, on_record: Callable | None = None,
                     engine: Engine | None = None) -> None:
    engine = engine or await build_engine(settings)
    if not store.config().get("generator_info"):
        store.update_config(generator_info=engine.generator_info)
    controller = Controller(settings.plan, engine.strategy, engine.generator, engine.pool, store, on_record)
    await controller.run(tasks)
