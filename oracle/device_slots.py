"""An oracle actor's device slots: candidates awaiting their first verdict go before re-timings.

A re-timing (a task's best kernel checked and timed again before it is written to `best/`) confirms a
verdict the search already has; a candidate waiting for its first verdict is what the search waits on. So a
re-timing takes a free slot only while the oracle has no candidate at all, waiting for a slot, on the
device or still being built: on an H200 run the re-timings of the tasks that ended early held slots (and
their tasks' room among the kept references) while later candidates queued behind them, and one started in
the seconds a candidate's build had left held the device alone (its eager baseline, then its own timing)
when that candidate came. Among candidates, and among re-timings, first come first served.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from typing import AsyncIterator


class DeviceSlots:
    def __init__(self, slots: int) -> None:
        self.free = slots
        self._waiting: dict[int, bool] = {}  # ticket -> first verdict (True) or re-timing (False), in order
        self.candidates = 0  # in the oracle, from the ask to the verdict (`candidate`)
        self._tickets = itertools.count()
        self._changed = asyncio.Condition()

    @property
    def waiting(self) -> int:
        """Candidates (first verdicts) waiting for a slot now."""
        return sum(self._waiting.values())

    def _may_take(self, ticket: int, first_verdict: bool) -> bool:
        if self.free <= 0:
            return False
        ahead = [t for t, first in self._waiting.items() if t < ticket and first == first_verdict]
        return not ahead and (first_verdict or not (self.waiting or self.candidates))

    @contextlib.asynccontextmanager
    async def candidate(self) -> AsyncIterator[None]:
        """A candidate in the oracle for the block (its build, its wait for a slot, its checks and timing):
        re-timings wait until none is."""
        self.candidates += 1
        try:
            yield
        finally:
            async with self._changed:
                self.candidates -= 1
                self._changed.notify_all()

    @contextlib.asynccontextmanager
    async def held(self, first_verdict: bool = True) -> AsyncIterator[None]:
        """A slot for the block. `first_verdict`: False for a re-timing, which yields to every candidate
        waiting for a slot and waits until no candidate is in the oracle."""
        ticket = next(self._tickets)
        async with self._changed:
            self._waiting[ticket] = first_verdict
            try:
                await self._changed.wait_for(lambda: self._may_take(ticket, first_verdict))
            finally:
                del self._waiting[ticket]
                self._changed.notify_all()  # a waiter behind this one may be next (or now takes a re-timing's turn)
            self.free -= 1
        try:
            yield
        finally:
            async with self._changed:
                self.free += 1
                self._changed.notify_all()
