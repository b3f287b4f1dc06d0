"""A candidate's way onto the device: room for its task's reference first, then a device slot.

The reference process keeps each task's expected outputs within a share of the device's memory
(`oracle.reference.ResidentBudget`); a candidate whose task does not fit beside the tasks being judged waits
for room. It waits before taking a device slot, not in one: a slot held by a candidate that cannot start
would keep the candidates of every other task (a small level-2 epilogue behind a 3 GB elementwise task)
off a device that has the memory and the time for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import AsyncIterator, ContextManager


@dataclass
class Waits:
    """Seconds a candidate waited on its way onto the device, working on nothing."""

    room: float = 0.0  # for room beside other tasks' references
    slot: float = 0.0  # for a device slot, once it had that room


class DeviceQueue:
    """The device slots of one oracle (candidates checked at once; their timings never overlap), entered
    through their task's room in the reference process. Used from one event loop."""

    def __init__(self, slots: int, room_threads: int = 32) -> None:
        self.slots = asyncio.Semaphore(slots)
        # Room is a blocking wait (a condition other threads signal): each waiter gets a thread of its own
        # here, never one of the default executor's, which the builds and checks need.
        self._threads = ThreadPoolExecutor(max_workers=room_threads, thread_name_prefix="room")
        self.waiting_for_room = 0  # candidates waiting now, for the live view

    @contextlib.asynccontextmanager
    async def entered(self, room: ContextManager | None) -> AsyncIterator[Waits]:
        """Hold `room` (None: the candidate needs none, e.g. it did not build), then a device slot."""
        waits = Waits()
        asked = time.perf_counter()
        if room is not None:
            self.waiting_for_room += 1
            try:
                await self._enter(room)
            finally:
                self.waiting_for_room -= 1
        try:
            waits.room = time.perf_counter() - asked
            asked = time.perf_counter()
            async with self.slots:
                waits.slot = time.perf_counter() - asked
                yield waits
        finally:
            if room is not None:
                room.__exit__(None, None, None)

    async def _enter(self, room: ContextManager) -> None:
        """Enter `room` in a thread. A caller cancelled meanwhile (its task stopped) leaves nothing held: the
        room is let go as soon as the thread gets it."""
        entering = asyncio.get_running_loop().run_in_executor(self._threads, room.__enter__)
        try:
            await asyncio.shield(entering)
        except asyncio.CancelledError:
            entering.add_done_callback(lambda done: _let_go(room, done))
            raise

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)


def _let_go(room: ContextManager, done: asyncio.Future) -> None:
    if not done.cancelled() and done.exception() is None:
        room.__exit__(None, None, None)
