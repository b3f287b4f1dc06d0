"""The oracle pool: oracle actors spread over the cluster's GPUs (or CPU oracles), fed least-loaded first.

A candidate that crashes its worker costs that sample only (the actor reports the verdict). An actor that
dies is restarted by Ray; the sample it was evaluating is recorded once as failed, never retried.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from oracle.actor import OracleActor
from oracle.candidate import Candidate
from oracle.evaluate import OracleConfig
from oracle.verdict import Verdict
from search.placement import ActorPlacement
from tasks.model import Task


def actor_options(p: ActorPlacement, groups: list[Any]) -> dict[str, Any]:
    """Ray actor options for a placement: its GPUs, its bundle of a placement group, its environment."""
    options: dict[str, Any] = {}
    if p.num_gpus:
        options["num_gpus"] = p.num_gpus
    if p.group is not None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            groups[p.group], placement_group_bundle_index=p.bundle, placement_group_capture_child_tasks=True)
    if p.env:
        options["runtime_env"] = {"env_vars": dict(p.env)}
    return options


@dataclass
class PoolSpec:
    device: str = "cpu"
    oracles: int = 1  # GPUs to use (one actor each); CPU oracles otherwise
    build_slots: int | None = None  # per actor; default: the node's cores / oracles


class OraclePool:
    def __init__(self, spec: PoolSpec, config: OracleConfig, placements: list[ActorPlacement] | None = None,
                 groups: list[Any] | None = None, gate: Any = None) -> None:
        """placements: per oracle, its GPU request, placement group (an index into `groups`, Ray placement
        groups) and timing-gate key (see `search.placement`); None: one GPU each on cuda, none on cpu."""
        if placements is None:
            placements = [ActorPlacement(1.0 if spec.device == "cuda" else 0.0)] * spec.oracles
        spec.oracles = len(placements)
        cores = int(ray.cluster_resources().get("CPU", os.cpu_count() or 2))
        slots = spec.build_slots or max(1, cores // max(1, spec.oracles) - 1)
        self.actors = []
        for p in placements:
            options = {"num_cpus": 1, **actor_options(p, groups or [])}
            key = p.gate_key if gate is not None else None
            self.actors.append(OracleActor.options(**options).remote(config, slots, gate if key else None, key))
        self.placements = placements
        self.in_flight = [0] * len(self.actors)
        self.spec = spec
        self.build_slots = slots
        self.device_slots = config.device_slots
        self._profiles: dict[tuple[str, str], asyncio.Future] = {}

    @property
    def capacity(self) -> int:
        """Candidates the pool can work on at once: every actor's build slots and its device slots."""
        return len(self.actors) * (self.build_slots + self.device_slots)

    def _pick(self) -> int:
        return min(range(len(self.actors)), key=lambda i: self.in_flight[i])

    async def evaluate(self, task: Task, candidate: Candidate, retime: bool = False) -> Verdict:
        i = self._pick()
        self.in_flight[i] += 1
        method = self.actors[i].retime if retime else self.actors[i].evaluate
        try:
            data = await method.remote(task.to_json(), candidate.__dict__)
            return Verdict.from_json(data)
        except (RayActorError, RayTaskError) as exc:
            return Verdict(task=task.id, status="runtime_error", backend=candidate.backend, hash=candidate.hash,
                           device=self.spec.device,
                           message=f"the oracle died while evaluating this sample ({type(exc).__name__}); it was restarted",
                           flags=["oracle_died"])
        finally:
            self.in_flight[i] -= 1

    async def profile(self, task: Task) -> dict[str, Any]:
        """The task's reference profile on the pool's device (see `oracle.profile`), computed once per task
        and code; `{"error": ...}` when profiling failed."""
        key = (task.id, task.code)
        if key not in self._profiles:
            fut = asyncio.get_running_loop().create_future()
            self._profiles[key] = fut
            i = self._pick()
            self.in_flight[i] += 1
            try:
                data = await self.actors[i].profile.remote(task.to_json())
            except (RayActorError, RayTaskError) as exc:
                data = {"task": task.id, "device": self.spec.device, "error": f"the oracle died while profiling ({type(exc).__name__})"}
            except BaseException:
                del self._profiles[key]
                fut.cancel()
                raise
            finally:
                self.in_flight[i] -= 1
            fut.set_result(data)
        return await asyncio.shield(self._profiles[key])

    async def stats(self) -> list[dict[str, Any]]:
        out = []
        for actor in self.actors:
            try:
                out.append(await actor.stats.remote())
            except (RayActorError, RayTaskError):
                out.append({"dead": True})
        return out
