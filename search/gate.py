"""The timing gate: generation pauses while an oracle that shares its GPU times something.

An oracle on a shared GPU calls `pause(key, holder)` before it times (a candidate, a baseline, a profile;
checks run beside generation) and `resume(key, holder)` when that ends; the gate pauses every generator registered under that key (the GPU group, see
`search.placement`; `all` reaches every generator) and resumes it only when no oracle holds one of its keys
any more (reference counting: with several oracles timing, generation resumes after the last one). `pause`
returns once the generators report they are paused, which for vLLM means its scheduler is frozen and the
device has synchronised, so the timing that follows is clean.

Failure handling: an oracle that died mid-timing is restarted by Ray and calls `forget(holder)` on start, so
its pause does not outlive it. A generator that does not answer within `timeout_s` (a replica being restarted
is loading its model, so it is not generating either) is not waited for: timing goes on and the miss is
counted. The generators are constructor arguments, so a gate restarted by Ray knows them again.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

import ray


@dataclass
class _Generator:
    handle: Any
    keys: frozenset[str]
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    paused: bool = False


class GateState:
    """Who holds which key (no Ray, no generators): the reference counting, unit-tested on its own."""

    def __init__(self) -> None:
        self.holds: Counter[tuple[str, str]] = Counter()  # (key, holder) -> open pauses

    def hold(self, key: str, holder: str) -> None:
        self.holds[(key, holder)] += 1

    def release(self, key: str, holder: str) -> None:
        if self.holds[(key, holder)] > 0:
            self.holds[(key, holder)] -= 1
        if self.holds[(key, holder)] <= 0:
            del self.holds[(key, holder)]

    def forget(self, holder: str) -> set[str]:
        """Drop a holder's pauses; the keys it held."""
        keys = {k for k, h in self.holds if h == holder}
        for k in keys:
            del self.holds[(k, holder)]
        return keys

    def held(self, keys: frozenset[str] | set[str]) -> bool:
        """Is any of these keys held (is a generator with these keys to be paused)?"""
        return any(k in keys or k == "all" for k, _ in self.holds)


@ray.remote(max_restarts=-1, max_task_retries=0)
class TimingGate:
    def __init__(self, generators: list[tuple[Any, list[str]]], timeout_s: float = 120.0) -> None:
        """generators: (GeneratorActor handle, its keys) for each generator replica."""
        self.timeout_s = timeout_s
        self.state = GateState()
        self.generators = [_Generator(handle, frozenset(keys)) for handle, keys in generators]
        self.counts = {"pause_calls": 0, "resume_calls": 0, "generator_pauses": 0, "generator_resumes": 0,
                       "misses": 0, "forgotten": 0}
        self.events: deque[tuple[float, str, str]] = deque(maxlen=10_000)  # (time.time(), what, key)

    async def pause(self, key: str, holder: str = "") -> None:
        self.counts["pause_calls"] += 1
        self.state.hold(key, holder)
        await self._sync_all()
        self.events.append((time.time(), "timing", key))

    async def resume(self, key: str, holder: str = "") -> None:
        self.counts["resume_calls"] += 1
        self.events.append((time.time(), "timed", key))
        self.state.release(key, holder)
        await self._sync_all()

    async def forget(self, holder: str) -> None:
        if self.state.forget(holder):
            self.counts["forgotten"] += 1
            await self._sync_all()

    async def _sync_all(self) -> None:
        await asyncio.gather(*(self._sync(g) for g in self.generators))

    async def _sync(self, gen: _Generator) -> None:
        """Bring one generator to the state the holds want now (under its lock, so calls never cross)."""
        async with gen.lock:
            want = self.state.held(gen.keys)
            if want == gen.paused:
                return
            try:
                await asyncio.wait_for((gen.handle.pause if want else gen.handle.resume).remote(), self.timeout_s)
            except Exception:  # noqa: BLE001 - dead or restarting: it is not generating; do not hold the oracle
                self.counts["misses"] += 1
            gen.paused = want
            self.counts["generator_pauses" if want else "generator_resumes"] += 1
            self.events.append((time.time(), "paused" if want else "resumed", ",".join(sorted(gen.keys))))

    def stats(self) -> dict[str, Any]:
        return {**self.counts, "holds": len(self.state.holds), "paused_now": [g.paused for g in self.generators],
                "events": list(self.events)}
