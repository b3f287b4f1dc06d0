"""The Ray actor that hosts a generator, so the engine (and its GPU) lives outside the driver.

The driver starts a request and then asks for its completions one at a time; each `next` returns as
soon as any sample of the request is finished, which is how samples stream into the oracle pool.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import ray

from search.generators.base import Completion, SampleRequest, timed

_DONE = None


@ray.remote(max_restarts=3, max_task_retries=0)
class GeneratorActor:
    def __init__(self, spec: str, options: dict[str, Any] | None = None) -> None:
        from search.generators.spec import make_generator

        self.generator = make_generator(spec, **(options or {}))
        self.queues: dict[str, asyncio.Queue] = {}
        self.pumps: dict[str, asyncio.Task] = {}
        self.paused = False
        self.counts = {"requests": 0, "samples": 0, "pauses": 0, "resumes": 0}

    async def start(self, request: SampleRequest) -> None:
        queue: asyncio.Queue = asyncio.Queue()
        self.queues[request.request_id] = queue
        self.counts["requests"] += 1
        self.counts["samples"] += request.n

        async def pump() -> None:
            try:
                async for completion in timed(self.generator.sample(request)):
                    await queue.put(completion)
            except Exception as exc:  # noqa: BLE001 - every missing sample is reported, none is lost
                await queue.put(exc)
            finally:
                await queue.put(_DONE)

        self.pumps[request.request_id] = asyncio.get_running_loop().create_task(pump())

    async def next(self, request_id: str) -> Completion | None:
        """The request's next finished completion, or None when it has no more."""
        queue = self.queues.get(request_id)
        if queue is None:
            return None
        item = await queue.get()
        if item is _DONE:
            self.queues.pop(request_id, None)
            self.pumps.pop(request_id, None)
            return None
        if isinstance(item, Exception):
            return Completion(request_id, -1, 0, "", error=f"{type(item).__name__}: {item}"[:500])
        return item

    async def abort(self, request_id: str) -> None:
        await self.generator.abort(request_id)

    async def pause(self) -> None:
        """Hold generation (the timing gate calls this while an oracle on the same GPU times). Idempotent."""
        if not self.paused:
            self.paused = True
            self.counts["pauses"] += 1
        await self.generator.pause()

    async def resume(self) -> None:
        if self.paused:
            self.paused = False
            self.counts["resumes"] += 1
        await self.generator.resume()

    def describe(self) -> dict[str, Any]:
        return self.generator.describe()

    def stats(self) -> dict[str, Any]:
        emitted = getattr(self.generator, "emitted", None)
        return {**self.counts, "paused": self.paused, "pid": os.getpid(), "outstanding": len(self.queues),
                **({"emitted": list(emitted)} if emitted is not None else {})}
