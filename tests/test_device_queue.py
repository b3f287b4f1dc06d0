"""The way onto the device: a candidate waits for its task's room in the reference process before it takes a
device slot, so a slot is never held by a candidate that cannot start."""

from __future__ import annotations

import asyncio
import threading

from oracle.device_queue import DeviceQueue
from oracle.reference import ResidentBudget


def test_a_candidate_waiting_for_room_holds_no_slot_while_another_tasks_candidate_goes_on():
    async def main() -> tuple[list[str], float]:
        budget = ResidentBudget(10)
        queue = DeviceQueue(slots=1)
        order: list[str] = []
        big_waits: list[float] = []
        held = budget.pinned("judged now", 10)  # a task that fills the budget, its candidate on the device
        held.__enter__()

        async def big() -> None:  # another large task: no room until the first one is done
            async with queue.entered(budget.pinned("large", 6)) as waits:
                order.append("large")
                big_waits.append(waits.room)

        async def small() -> None:  # a candidate of the task already held joins it at no cost
            async with queue.entered(budget.pinned("judged now", 10)):
                order.append("joined")
                await asyncio.sleep(0.05)

        large = asyncio.create_task(big())
        await asyncio.sleep(0.2)  # `large` is waiting for room now, and must not hold the one slot
        assert queue.waiting_for_room == 1
        await asyncio.wait_for(small(), 5)
        assert order == ["joined"]
        threading.Timer(0.3, held.__exit__, (None, None, None)).start()
        await asyncio.wait_for(large, 5)
        queue.close()
        assert budget.used == 0 and queue.waiting_for_room == 0
        return order, big_waits[0]

    order, waited = asyncio.run(main())
    assert order == ["joined", "large"]
    assert 0.4 <= waited < 5.0


def test_a_failed_build_needs_no_room_and_a_slot_wait_is_measured():
    async def main() -> tuple[float, float]:
        queue = DeviceQueue(slots=1)
        async with queue.entered(None):
            later = asyncio.create_task(_enter_and_report(queue))
            await asyncio.sleep(0.3)
        room, slot = await asyncio.wait_for(later, 5)
        queue.close()
        return room, slot

    room, slot = asyncio.run(main())
    assert room < 0.1 and 0.25 <= slot < 5.0


async def _enter_and_report(queue: DeviceQueue) -> tuple[float, float]:
    async with queue.entered(None) as waits:
        return waits.room, waits.slot


def test_a_candidate_cancelled_while_waiting_for_room_leaves_nothing_held():
    """A task stopped early cancels its queued candidates: one cancelled in its wait must not keep the room
    it gets afterwards, or the reference process's budget would shrink for the rest of the run."""

    async def main() -> tuple[ResidentBudget, _Recorded]:
        budget = ResidentBudget(10)
        queue = DeviceQueue(slots=1)
        held = budget.pinned("judged now", 10)
        held.__enter__()
        room = _Recorded(budget.pinned("large", 6))

        async def waiting() -> None:
            async with queue.entered(room):
                raise AssertionError("a cancelled candidate reached the device")

        pending = asyncio.create_task(waiting())
        await asyncio.sleep(0.2)
        pending.cancel()
        await asyncio.gather(pending, return_exceptions=True)
        held.__exit__(None, None, None)  # the waiting thread now gets the room, and must give it back
        for _ in range(250):
            if room.exited.is_set():
                break
            await asyncio.sleep(0.02)
        queue.close()
        return budget, room

    budget, room = asyncio.run(main())
    assert room.entered.is_set() and room.exited.is_set()
    assert budget.used == 0  # the whole budget is free again


class _Recorded:
    """A room that says when it was entered and let go."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.entered, self.exited = threading.Event(), threading.Event()

    def __enter__(self) -> None:
        self.inner.__enter__()
        self.entered.set()

    def __exit__(self, *exc: object) -> None:
        self.inner.__exit__(*exc)
        self.exited.set()
