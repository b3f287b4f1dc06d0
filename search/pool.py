"""The oracle pool: oracle actors spread over the cluster's nodes and GPUs (or CPU oracles), fed least-loaded first.

A candidate that crashes its worker costs that sample only (the actor reports the verdict). An actor that
dies is restarted by Ray on its node; the sample it was evaluating is recorded once as failed, never retried
(the candidate may be what killed it).

A node that is lost (its raylet gone: the machine died, or was taken away) takes its oracles with it for
good: the pool stops sending them work, and each sample that was on one of them is judged once more on an
oracle of another node (flag `node_lost_retried`); lost twice, it is recorded failed. Which of the two
happened is asked of Ray after the call fails: the node is dead (lost), or the actor answers again
(restarted), within `loss_wait_s`. The pool's verdicts say which node judged them (`JudgedVerdict.node`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import ActorUnschedulableError, RayActorError, RayTaskError

from oracle import judge
from oracle.actor import OracleActor
from oracle.candidate import Candidate
from oracle.evaluate import OracleConfig
from oracle.verdict import Verdict
from search.placement import ActorPlacement
from tasks.model import Task

_DEAD = (RayActorError, ActorUnschedulableError)  # the actor died, is unreachable, or cannot be placed again


def actor_options(p: ActorPlacement, groups: list[Any], hard_node: bool = True) -> dict[str, Any]:
    """Ray actor options for a placement: its GPUs, its bundle of a placement group or its node, its environment.
    hard_node: it runs on its node or not at all (oracles); otherwise its node is preferred, and a restart
    after the node is lost may go elsewhere (generators, whose samples Ray's restart keeps coming)."""
    options: dict[str, Any] = {}
    if p.num_gpus:
        options["num_gpus"] = p.num_gpus
    if p.group is not None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            groups[p.group], placement_group_bundle_index=p.bundle, placement_group_capture_child_tasks=True)
    elif p.node is not None:  # an oracle that lost its node must not come back elsewhere unannounced
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(p.node, soft=not hard_node)
    if p.env:
        options["runtime_env"] = {"env_vars": dict(p.env)}
    return options


@dataclass
class JudgedVerdict(Verdict):
    """A verdict and the Ray node of the oracle that reached it (None where the pool does not know it)."""

    node: str | None = None


@dataclass
class PoolSpec:
    device: str = "cpu"
    oracles: int = 1  # GPUs to use (one actor each); CPU oracles otherwise
    build_slots: int | None = None  # per actor; default: its node's cores / its node's oracles


@dataclass
class OracleSlot:
    """One oracle actor of the pool, where it runs, and whether it still counts."""

    actor: Any
    placement: ActorPlacement
    build_slots: int
    in_flight: int = 0
    lost: bool = False  # its node is gone (or it never answered again): no more work for it
    checking: asyncio.Future | None = field(default=None, repr=False)  # a fate being asked of Ray after a failure

    @property
    def node(self) -> str | None:
        return self.placement.node

    @property
    def usable(self) -> bool:
        return not self.lost and self.checking is None


def pick_oracle(loads: list[int], usable: list[bool], last: int, prefer: int | None = None) -> int | None:
    """The oracle for the next candidate: `prefer` when it is usable and as little loaded as any, else the
    least loaded usable one, ties going round from the one after `last` (so oracles of a cluster share the
    work even when each candidate is finished before the next arrives). None: no oracle is usable."""
    choices = [i for i in range(len(loads)) if usable[i]]
    if not choices:
        return None
    least = min(loads[i] for i in choices)
    if prefer is not None and prefer in choices and loads[prefer] == least:
        return prefer
    n = len(loads)
    return min((i for i in choices if loads[i] == least), key=lambda i: (i - last - 1) % n)


class NoOracleLeft(RuntimeError):
    """Every oracle of the pool was lost with its node: the run stops, `--resume` finishes it elsewhere."""


class OraclePool:
    def __init__(self, spec: PoolSpec, config: OracleConfig, placements: list[ActorPlacement] | None = None,
                 groups: list[Any] | None = None, gate: Any = None, node_labels: dict[str, str] | None = None,
                 loss_wait_s: float = 120.0) -> None:
        """placements: per oracle, its GPU request, placement group (an index into `groups`, Ray placement
        groups), node, build slots and timing-gate key (see `search.placement`); None: one GPU each on cuda,
        none on cpu, wherever Ray puts them. node_labels: node id -> what the live view calls it."""
        if placements is None:
            placements = [ActorPlacement(1.0 if spec.device == "cuda" else 0.0)] * spec.oracles
        spec.oracles = len(placements)
        cores = int(ray.cluster_resources().get("CPU", os.cpu_count() or 2))
        default_slots = max(1, cores // max(1, spec.oracles) - 1)
        self.oracles: list[OracleSlot] = []
        for p in placements:
            slots = spec.build_slots or p.build_slots or default_slots
            options = {"num_cpus": 1, **actor_options(p, groups or [])}
            key = p.gate_key if gate is not None else None
            actor = OracleActor.options(**options).remote(config, slots, gate if key else None, key)
            self.oracles.append(OracleSlot(actor, p, slots))
        self.actors = [o.actor for o in self.oracles]
        self.placements = placements
        self.spec = spec
        self.build_slots = max(o.build_slots for o in self.oracles)
        self.device_slots = config.device_slots
        self.wants_compile = config.wants_compile
        self.node_labels = dict(node_labels or {})
        self.loss_wait_s = loss_wait_s
        self._last = -1
        self._judged_on: dict[str, int] = {}  # candidate hash -> the oracle that judged it (its build is cached there)
        self._profiles: dict[tuple[str, str], asyncio.Future] = {}

    @property
    def capacity(self) -> int:
        """Candidates the pool can work on at once: every oracle's build slots and its device slots."""
        return sum(o.build_slots + self.device_slots for o in self.oracles if not o.lost)

    @property
    def in_flight(self) -> list[int]:
        return [o.in_flight for o in self.oracles]

    def _pick(self, exclude: set[int] = frozenset(), prefer: int | None = None) -> int | None:
        """An oracle not lost (nor in `exclude`), preferring those not being asked about after a failure
        (when all are, Ray holds the call until the actor is back). None: every oracle is lost."""
        alive = [not o.lost and i not in exclude for i, o in enumerate(self.oracles)]
        settled = [a and o.checking is None for a, o in zip(alive, self.oracles)]
        i = pick_oracle(self.in_flight, settled if any(settled) else alive, self._last, prefer)
        if i is not None:
            self._last = i
        return i

    async def _fate(self, i: int) -> str:
        """After a call to oracle i failed: 'lost' (its node is gone, or it never answered within
        loss_wait_s) or 'restarted' (Ray brought the actor back). One question to Ray per failure, shared
        by every call that failed with it."""
        slot = self.oracles[i]
        if slot.lost:
            return "lost"
        if slot.checking is None:
            slot.checking = asyncio.ensure_future(self._ask_fate(slot))
            slot.checking.add_done_callback(lambda _: setattr(slot, "checking", None))
        return await asyncio.shield(slot.checking)

    def _lose_node(self, slot: OracleSlot) -> str:
        """The slot's node is gone: so are the other oracles on it, idle ones included."""
        for other in self.oracles:
            if other is slot or (slot.node is not None and other.node == slot.node):
                other.lost = True
        return "lost"

    async def _ask_fate(self, slot: OracleSlot) -> str:
        deadline = time.monotonic() + self.loss_wait_s
        while True:
            if slot.node is not None and not await asyncio.to_thread(node_alive, slot.node):
                return self._lose_node(slot)
            try:
                await asyncio.wait_for(slot.actor.stats.remote(), timeout=10)
                return "restarted"
            except ActorUnschedulableError:  # its node is gone: Ray cannot place it again
                return self._lose_node(slot)
            except (RayActorError, RayTaskError, asyncio.TimeoutError):
                pass
            if time.monotonic() > deadline:
                slot.lost = True
                return "lost"
            await asyncio.sleep(1.0)

    async def _call(self, method: str, *args: Any, prefer: int | None = None) -> tuple[Any, int, list[str]]:
        """Call an oracle method on the least-loaded oracle; on a lost node once more on another oracle.
        Returns (result, oracle index, flags); a failure that is not a lost node raises `_Failed`."""
        flags: list[str] = []
        tried: set[int] = set()
        while True:
            i = self._pick(tried, prefer)
            if i is None:  # only lost oracles are ever left out
                raise NoOracleLeft("every oracle was lost with its node: finish the run with --resume on a "
                                   "cluster that has nodes again")
            slot = self.oracles[i]
            slot.in_flight += 1
            try:
                return await getattr(slot.actor, method).remote(*args), i, flags
            except RayTaskError as exc:
                raise _Failed(f"the oracle failed on this sample ({type(exc).__name__}: {exc})"[:500], flags + ["oracle_error"]) from None
            except _DEAD as exc:
                fate = await self._fate(i)
                if fate == "restarted":
                    raise _Failed(f"the oracle died while evaluating this sample ({type(exc).__name__}); it was restarted",
                                  flags + ["oracle_died"]) from None
                if flags:  # lost a second time
                    raise _Failed("the nodes of two oracles were lost while they evaluated this sample", flags + ["node_lost"]) from None
                flags = ["node_lost_retried"]
                tried |= {k for k, o in enumerate(self.oracles) if k == i or (o.node is not None and o.node == slot.node)}
            finally:
                slot.in_flight -= 1

    async def evaluate(self, task: Task, candidate: Candidate, retime: bool = False) -> JudgedVerdict:
        prefer = self._judged_on.get(candidate.hash) if retime else None
        try:
            data, i, flags = await self._call("retime" if retime else "evaluate", task.to_json(), candidate.__dict__,
                                              prefer=prefer)
        except _Failed as exc:
            return JudgedVerdict(task=task.id, status="runtime_error", backend=candidate.backend, hash=candidate.hash,
                                 device=self.spec.device, message=exc.message, flags=exc.flags)
        self._judged_on.setdefault(candidate.hash, i)
        verdict = JudgedVerdict.from_json({**data, "node": self.oracles[i].node})
        verdict.flags = list(verdict.flags) + flags
        return verdict

    async def with_compile_baseline(self, task: Task, verdict: JudgedVerdict) -> JudgedVerdict:
        """A correct verdict with its torch.compile speedup, from the oracle that judged it (whose reference
        process measures the task's baseline). Awaited outside the search's oracle slots. If that oracle is
        gone the verdict stays as it is, with the reason as its compile error."""
        i = self._judged_on.get(verdict.hash or "")
        if verdict.status != "correct" or not self.wants_compile or i is None or self.oracles[i].lost:
            return verdict
        try:
            data = await self.oracles[i].actor.with_compile_baseline.remote(task.to_json(), verdict.to_json())
        except (RayTaskError, *_DEAD) as exc:
            data = judge.with_compile_baseline(verdict.to_json(), None, "the oracle failed before the torch.compile "
                                               f"baseline was measured ({type(exc).__name__})")
        judged = JudgedVerdict.from_json({**data, "node": verdict.node})
        judged.flags = list(verdict.flags)
        return judged

    async def profile(self, task: Task) -> dict[str, Any]:
        """The task's reference profile on the pool's device (see `oracle.profile`), computed once per task
        and code; `{"error": ...}` when profiling failed."""
        key = (task.id, task.code)
        if key not in self._profiles:
            fut = asyncio.get_running_loop().create_future()
            self._profiles[key] = fut
            try:
                data, _, _ = await self._call("profile", task.to_json())
            except _Failed as exc:
                data = {"task": task.id, "device": self.spec.device, "error": f"profiling failed: {exc.message}"}
            except BaseException:
                del self._profiles[key]
                fut.cancel()
                raise
            fut.set_result(data)
        return await asyncio.shield(self._profiles[key])

    async def stats(self) -> list[dict[str, Any]]:
        """Per oracle: the actor's own figures and its node (`node`, `node_label`); `dead` while it does not
        answer, `lost` once its node is gone (lost oracles are no longer asked)."""

        async def one(slot: OracleSlot) -> dict[str, Any]:
            where = {"node": slot.node, "node_label": self.node_labels.get(slot.node or "", (slot.node or "")[:6] or "-")}
            if slot.lost:
                return {"dead": True, "lost": True, **where}
            try:
                return {**await slot.actor.stats.remote(), **where}
            except (*_DEAD, RayTaskError):
                return {"dead": True, **where}

        return list(await asyncio.gather(*(one(o) for o in self.oracles)))

    async def close(self, timeout_s: float = 30.0) -> None:
        """Close every oracle still answering (`OracleActor.close`); one that does not answer in time is
        left to Ray's end of it."""

        async def one(slot: OracleSlot) -> None:
            if not slot.lost:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(slot.actor.close.remote(), timeout=timeout_s)

        await asyncio.gather(*(one(o) for o in self.oracles))


class _Failed(Exception):
    """An oracle call that ends the sample as a failure (message and flags for its verdict)."""

    def __init__(self, message: str, flags: list[str]) -> None:
        super().__init__(message)
        self.message, self.flags = message, flags


def node_alive(node_id: str) -> bool:
    """Whether Ray's control store still counts the node as alive (a node it has never heard of is not)."""
    return any(n.get("NodeID") == node_id and n.get("Alive") for n in ray.nodes())
