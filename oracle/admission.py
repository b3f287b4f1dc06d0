"""Admission to the device: a device slot (`oracle.device_slots`) together with the candidate's task pinned
among the kept references (`oracle.reference.ResidentBudget`).

A slot is held only with the task pinned. On an H200 the four slots were held by level-1 candidates waiting
their turn for the references' room (one level-1 task at the dataset's size fills it), while candidates of
small tasks, built and with room to spare, waited behind them for a slot.

- A candidate awaiting its first verdict pins first, then asks for its slot.
- A re-timing asks for its slot first: it takes one only while the oracle has no candidate, and a pin
  held meanwhile would keep those very candidates from their room. With the slot it pins if its task
  fits now, and otherwise gives the slot back until room is released.
- The room's main share is first come, first served (`ResidentBudget`), re-timings after candidates.

The room's waiters wait on the event loop, woken (in the order they came) whenever a task's room is
released by any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import AsyncIterator, Iterator

from oracle.device_slots import DeviceSlots
from oracle.reference import ResidentBudget, Room


@dataclass
class Waited:
    """Seconds an admitted candidate waited: for a device slot, and for room among the kept references."""

    slot_s: float = 0.0
    room_s: float = 0.0


class Admission:
    def __init__(self, slots: DeviceSlots, resident: ResidentBudget) -> None:
        self.slots = slots
        self.resident = resident
        self._waiters: list[asyncio.Event] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    @contextlib.asynccontextmanager
    async def admitted(self, room: Room, first_verdict: bool = True) -> AsyncIterator[Waited]:
        """A device slot with the task (its `room`) pinned, for the block; `first_verdict`: False for a
        re-timing (see the module's docstring)."""
        waited = Waited()
        key = room.key
        ticket = self.resident.ticket()  # its place in line for the main room (`ResidentBudget`)
        pin = lambda: self.resident.try_pin(key, room.kept_bytes, ticket, first_verdict, room.small)  # noqa: E731
        with self._waiter() as released, self._in_line(ticket):
            while True:
                if first_verdict and pin():
                    try:
                        t = time.perf_counter()
                        async with self.slots.held():
                            waited.slot_s += time.perf_counter() - t
                            yield waited
                            return
                    finally:
                        self.resident.unpin(key)
                elif not first_verdict:
                    t = time.perf_counter()
                    async with self.slots.held(first_verdict=False):
                        waited.slot_s += time.perf_counter() - t
                        if pin():
                            try:
                                yield waited
                                return
                            finally:
                                self.resident.unpin(key)
                t = time.perf_counter()
                await released.wait()
                released.clear()
                waited.room_s += time.perf_counter() - t

    @contextlib.contextmanager
    def _in_line(self, ticket: int) -> Iterator[None]:
        try:
            yield
        finally:
            self.resident.leave(ticket)  # cancelled while waiting: out of the line

    @contextlib.contextmanager
    def _waiter(self) -> Iterator[asyncio.Event]:
        if self._loop is None:
            loop = self._loop = asyncio.get_running_loop()
            self.resident.on_release(lambda: loop.call_soon_threadsafe(self._released))
        released = asyncio.Event()
        self._waiters.append(released)
        try:
            yield released
        finally:
            self._waiters.remove(released)

    def _released(self) -> None:
        for released in self._waiters:
            released.set()
