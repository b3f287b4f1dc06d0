"""The controller's one way to the generator: `GeneratorClient.sample` streams a request's completions and
`abort` stops them, hiding the Ray actors and the data-parallel replicas (`--generator-replicas K`) behind it.

Every request is spread over the K generator actors: each of its n samples goes to the replica with the fewest
samples outstanding, so one task's samples are written by all replicas at once. A sample keeps its seed and
task-wide number wherever it runs, so a run's samples do not depend on K.

Each of a request's samples comes out exactly once, as soon as it is finished: a sample that could not be
generated comes out with `error` set and empty text. A replica that dies is restarted by Ray (the actor's
`max_restarts`); the samples it held fail once, and later requests go to it again once it is back. An abort
goes to the replicas that hold the request; their samples not yet delivered do not come out.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from ray.exceptions import RayActorError, RayTaskError

from search.generators.base import Completion, SampleRequest

_DEAD_ERRORS = (RayActorError, RayTaskError)


@dataclass
class _Part:
    replica: int
    request_id: str
    indices: list[int]  # positions in the whole request, by position in this part
    delivered: set[int] = field(default_factory=set)


@dataclass
class _Split:
    queue: asyncio.Queue
    parts: list[_Part]
    pumps: list[asyncio.Task] = field(default_factory=list)


class GeneratorClient:
    """`sample` and `abort` over one or more `GeneratorActor` handles (anything with their remote methods)."""

    def __init__(self, actors: list[Any]) -> None:
        if not actors:
            raise ValueError("GeneratorClient needs at least one generator actor")
        self.actors = list(actors)
        self.outstanding = [0] * len(self.actors)  # samples started on each replica and not yet delivered
        self.served = [0] * len(self.actors)  # samples each replica delivered (or failed)
        self.deaths = [0] * len(self.actors)
        self._requests: dict[str, _Split] = {}

    def __len__(self) -> int:
        return len(self.actors)

    # -- spreading -----------------------------------------------------------------------------------------

    def assign(self, n: int) -> list[list[int]]:
        """Sample positions 0..n-1 per replica: each to the replica with the fewest samples outstanding then
        (ties to the lower number), counting those just assigned."""
        load = list(self.outstanding)
        parts: list[list[int]] = [[] for _ in self.actors]
        for i in range(n):
            r = min(range(len(load)), key=lambda k: load[k])
            parts[r].append(i)
            load[r] += 1
        return parts

    async def sample(self, request: SampleRequest) -> AsyncIterator[Completion]:
        """Each of the request's samples as soon as it is finished (any order), each once (`generation_s` as
        its generator actor timed it)."""
        await self._start(request)
        split = self._requests[request.request_id]
        try:
            while (completion := await split.queue.get()) is not None:
                yield completion
        finally:
            self._requests.pop(request.request_id, None)

    async def _start(self, request: SampleRequest) -> None:
        rid = request.request_id
        assigned = [(r, idx) for r, idx in enumerate(self.assign(request.n)) if idx]
        split = _Split(asyncio.Queue(), [])
        self._requests[rid] = split
        numbers = request.samples or list(range(request.n))
        for r, idx in assigned:
            part = _Part(r, rid if len(assigned) == 1 else f"{rid}@{r}", idx)
            sub = dataclasses.replace(request, request_id=part.request_id, seeds=[request.seeds[i] for i in idx],
                                      samples=[numbers[i] for i in idx])
            split.parts.append(part)
            self.outstanding[r] += len(idx)
            try:
                await self.actors[r].start.remote(sub)
            except _DEAD_ERRORS as exc:
                self._fail_rest(split, part, request, exc)
                continue
            split.pumps.append(asyncio.get_running_loop().create_task(self._pump(split, part, request)))
        asyncio.get_running_loop().create_task(self._close_when_done(split))

    async def _pump(self, split: _Split, part: _Part, request: SampleRequest) -> None:
        actor = self.actors[part.replica]
        while True:
            try:
                completion: Completion | None = await actor.next.remote(part.request_id)
            except _DEAD_ERRORS as exc:
                self._fail_rest(split, part, request, exc)
                return
            if completion is None:
                self.outstanding[part.replica] -= len(part.indices) - len(part.delivered)  # aborted ones
                part.delivered.update(range(len(part.indices)))
                return
            if completion.index < 0:  # the generator raised: the part's undelivered samples fail, once
                self._fail_rest(split, part, request, None, completion.error)
                return
            local = completion.index
            if local in part.delivered or not 0 <= local < len(part.indices):
                continue
            part.delivered.add(local)
            self.outstanding[part.replica] -= 1
            self.served[part.replica] += 1
            completion.index = part.indices[local]
            completion.request_id = request.request_id
            completion.replica = part.replica
            split.queue.put_nowait(completion)

    def _fail_rest(self, split: _Split, part: _Part, request: SampleRequest, exc: BaseException | None,
                   error: str | None = None) -> None:
        if isinstance(exc, RayActorError):
            self.deaths[part.replica] += 1
            error = (f"generator replica {part.replica} died ({type(exc).__name__}) with this sample outstanding; "
                     "Ray restarts it")
        elif exc is not None:
            error = f"generator replica {part.replica} failed: {str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__}"[:500]
        for local, i in enumerate(part.indices):
            if local in part.delivered:
                continue
            part.delivered.add(local)
            self.outstanding[part.replica] -= 1
            self.served[part.replica] += 1
            split.queue.put_nowait(Completion(request.request_id, i, request.seeds[i], "", error=error or "generation failed",
                                              replica=part.replica))

    async def _close_when_done(self, split: _Split) -> None:
        await asyncio.gather(*split.pumps, return_exceptions=True)
        split.queue.put_nowait(None)

    # -- the rest --------------------------------------------------------------------------------------------

    async def abort(self, request_id: str) -> None:
        """Stop the request's outstanding samples; its stream ends soon after. Unknown ids are ignored."""
        split = self._requests.get(request_id)
        if split is None:
            return
        for part in split.parts:
            with contextlib.suppress(*_DEAD_ERRORS):  # a dead replica has nothing left to abort
                await self.actors[part.replica].abort.remote(part.request_id)

    async def describe(self) -> dict[str, Any]:
        info = await self.actors[0].describe.remote()
        return {**info, "replicas": len(self.actors)}

    async def stats(self) -> list[dict[str, Any]]:
        out = []
        for r, actor in enumerate(self.actors):
            try:
                data = await actor.stats.remote()
            except _DEAD_ERRORS:
                data = {"dead": True}
            out.append({**data, "replica": r, "outstanding_samples": self.outstanding[r], "served": self.served[r],
                        "deaths": self.deaths[r]})
        return out
