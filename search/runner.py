"""Start a run: Ray, the generator actor, the oracle pool, the controller, the store, and progress output."""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, ClassVar

import ray
from ray.exceptions import RayActorError
from ray.util.placement_group import placement_group

from oracle.evaluate import OracleConfig
from search.controller import Controller, SearchPlan
from search.gate import TimingGate
from search.generators.actor import GeneratorActor
from search.generators.base import GeneratorError
from search.generators.client import GeneratorClient
from search.generators.spec import parse_generator_spec
from search.cluster import NODE_LABEL, cluster_nodes, join_cluster
from search.placement import NodeShape, Placement, PlacementError, plan_placement
from search.pool import OraclePool, PoolSpec, actor_options
from search.store import OracleDevice, RunStore
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
    tolerance: str = "kernelbench"  # the tolerance policy of the run's verdicts (oracle.tolerance)
    strategy_backend: str = "cuda"
    strategy_options: dict[str, Any] = field(default_factory=dict)  # e.g. agents: {"ambition": "full"}
    compile_baseline: bool | None = None  # None: the oracle's default (on a GPU only)
    generator_replicas: int = 1  # data-parallel copies of the generator actor
    tensor_parallel_size: int = 1  # GPUs per vLLM replica
    share_generator: bool = False  # force the shared-GPU path: pause generation while an oracle times
    generator_options: dict[str, Any] = field(default_factory=dict)  # extra constructor options (tests)

    # Where this invocation runs, not what the run is: given again on --resume, never stored.
    PER_INVOCATION: ClassVar[frozenset[str]] = frozenset({"address"})

    def to_json(self) -> dict[str, Any]:
        """The settings as config.json holds them (`from_json` reads them back). The strategy's backend
        sits in `strategy_options` beside its other options, as `make_strategy` takes them."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in self.PER_INVOCATION}
        data["plan"] = asdict(self.plan)
        data["strategy_options"] = {"backend": data.pop("strategy_backend"), **self.strategy_options}
        return data

    @classmethod
    def from_json(cls, config: dict[str, Any], **given: Any) -> "RunSettings":
        """The settings of a run folder's config.json (keys it does not know are other parts of the config;
        settings it lacks take their defaults); `given`: the per-invocation ones, e.g. `address`."""
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in config.items() if k in names}
        options = dict(values.get("strategy_options") or {})
        values["strategy_backend"] = options.pop("backend", "cuda")
        values["strategy_options"] = options
        plan_fields = {f.name for f in fields(SearchPlan)}
        values["plan"] = SearchPlan(**{k: v for k, v in config["plan"].items() if k in plan_fields})
        return cls(**{**values, **given})


def versions() -> dict[str, str]:
    import numpy
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__, "ray": ray.__version__,
            "numpy": numpy.__version__, "platform": platform.platform()}


def start_ray(address: str | None, device: str) -> dict[str, Any]:
    """Join a cluster, or start a local one sized for this machine (quick on a 2-core CPU). A joined cluster
    gets the project's packages shipped to its nodes (`search.placement.cluster_runtime_env`); one that
    cannot be reached is a `ClusterError` with one line for the user (`search.cluster.join_cluster`)."""
    if not ray.is_initialized():
        kwargs: dict[str, Any] = dict(include_dashboard=False, logging_level="ERROR", log_to_driver=False)
        if address:
            join_cluster(address, **kwargs)
        else:
            ray.init(num_cpus=max(2, os.cpu_count() or 2), **kwargs)
    return ray.cluster_resources()


def make_config(settings: RunSettings, tasks: list[Task], generator_info: dict[str, Any], resources: dict[str, Any]) -> dict[str, Any]:
    return {
        **settings.to_json(), "generator_info": generator_info,
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
    generator: GeneratorClient  # sample and abort, spread over the replicas
    pool: OraclePool
    strategy: Any
    generator_info: dict[str, Any]
    placement: Placement | None = None
    gate: Any = None  # TimingGate handle when generation pauses while an oracle times
    groups: list[Any] = field(default_factory=list)  # Ray placement groups of shared GPUs


def plan_for(settings: RunSettings, nodes: list[NodeShape]) -> Placement:
    """Where this run's actors go on these nodes (`search.placement`)."""
    kind, _ = parse_generator_spec(settings.generator)
    return plan_placement(device=settings.device, oracle_gpus=settings.gpus, generator_gpus=kind == "vllm",
                          tensor_parallel_size=settings.tensor_parallel_size, replicas=settings.generator_replicas,
                          share=settings.share_generator, nodes=nodes)


async def build_engine(settings: RunSettings) -> Engine:
    """The generator replicas, the oracle pool (one actor per GPU, or a CPU oracle), the timing gate where
    they share GPUs, and the strategy. Where everything goes is `search.placement`'s decision."""
    nodes = cluster_nodes()
    try:
        placement = plan_for(settings, nodes)
    except PlacementError as exc:
        raise RuntimeError(str(exc)) from None
    groups = []
    for size, node in zip(placement.groups, placement.group_nodes):
        group = placement_group([{"GPU": 1.0}] * size, strategy="STRICT_PACK",
                                bundle_label_selector=[{NODE_LABEL: node}] * size if node else None)
        try:
            await asyncio.wait_for(group.ready(), 120)
        except asyncio.TimeoutError:
            raise RuntimeError(f"cannot reserve {size} GPU(s) on one node for a generator replica") from None
        groups.append(group)
    options = {"seed": settings.plan.seed, **placement.generator_options, **settings.generator_options}
    actors = [GeneratorActor.options(num_cpus=0, **actor_options(p, groups, hard_node=False)).remote(settings.generator, options)
              for p in placement.generators]
    gate = None
    if placement.gated:
        gate = TimingGate.options(num_cpus=0).remote(
            [(a, [p.gate_key]) for a, p in zip(actors, placement.generators) if p.gate_key])

    def start_oracles() -> OraclePool:
        return OraclePool(PoolSpec(device=settings.device, oracles=len(placement.oracles)),
                          OracleConfig(device=settings.device, allow_torch=settings.allow_torch,
                                       tolerance=settings.tolerance, compile_baseline=settings.compile_baseline),
                          placements=placement.oracles, groups=groups, gate=gate,
                          node_labels={n.node_id: n.label for n in nodes})

    # Apart from the generator's GPUs, the oracles start while the generator loads its model (tens of seconds
    # for vLLM): their start, and the precompiled header a GPU oracle asks for as it starts, are then done
    # before the first build. On a GPU it shares, an oracle starts after: vLLM sizes its cache by the memory
    # free while it loads, which an oracle setting up beside it would change.
    pool = None if placement.gated else start_oracles()
    try:
        infos = await asyncio.gather(*(a.describe.remote() for a in actors))
    except RayActorError as exc:
        raise GeneratorError(f"the generator {settings.generator} could not start: {_cause(exc)}") from None
    info = {**infos[0], "replicas": len(actors), "placement": placement.describe()}
    pool = pool or start_oracles()
    strategy = make_strategy(settings.strategy, settings.strategy_backend, **settings.strategy_options)
    return Engine(GeneratorClient(actors), pool, strategy, info, placement, gate, groups)


async def run_search(settings: RunSettings, tasks: list[Task], store: RunStore, on_record: Callable | None = None,
                     engine: Engine | None = None) -> None:
    engine = engine or await build_engine(settings)
    if not store.config().get("generator_info"):
        store.update_config(generator_info=engine.generator_info)
    controller = Controller(settings.plan, engine.strategy, engine.generator, engine.pool, store, on_record,
                            device=settings.device)
    started = asyncio.ensure_future(_record_oracle_start(engine.pool, store))
    device = asyncio.ensure_future(_record_oracle_device(engine.pool, store))
    try:
        await controller.run(tasks)
    finally:
        started.cancel()
        device.cancel()
        with contextlib.suppress(Exception):  # the last figures, the run's end included
            await asyncio.wait_for(_write_oracle_device(engine.pool, store), timeout=10)
        await engine.pool.close()


DEVICE_RECORD_EVERY_S = 10.0


async def _record_oracle_device(pool: OraclePool, store: RunStore, every_s: float | None = None) -> None:
    """Every few seconds, where each oracle's device time has gone so far (`oracles_device` in config.json):
    a run cut short still says how long its device was busy, held alone, and by what."""
    while True:
        await asyncio.sleep(DEVICE_RECORD_EVERY_S if every_s is None else every_s)
        with contextlib.suppress(Exception):  # a diagnostic: never the run's failure
            await _write_oracle_device(pool, store)


async def _write_oracle_device(pool: OraclePool, store: RunStore) -> None:
    stats = await pool.stats()
    store.update_config(oracles_device=[OracleDevice.of(s).to_json() for s in stats if "alive_s" in s])


async def _record_oracle_start(pool: OraclePool, store: RunStore) -> None:
    """Once every oracle answers: when each became ready and what its start spent (`oracles_started` in
    config.json, beside the run's `started_at`), so that a cold run's wait for its first build can be read back."""
    stats = await pool.stats()
    with contextlib.suppress(OSError):  # a diagnostic: never the run's failure
        store.update_config(oracles_started=[{"node": s.get("node_label"), "ready_at": s.get("ready_at"),
                                              "init_s": s.get("init_s")} for s in stats if "ready_at" in s])
