"""The device slots' order: first verdicts before re-timings, first come first served within each."""

from __future__ import annotations

import asyncio

from oracle.device_slots import DeviceSlots


async def _take(slots: DeviceSlots, name: str, first_verdict: bool, order: list[str], release: asyncio.Event) -> None:
    async with slots.held(first_verdict):
        order.append(name)
        await release.wait()


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_a_retiming_waits_while_a_candidate_waits_and_takes_a_free_slot_otherwise():
    async def main() -> list[str]:
        slots, order = DeviceSlots(1), []
        gates = {name: asyncio.Event() for name in ("c1", "r1", "c2", "c3", "r2")}
        tasks = [asyncio.create_task(_take(slots, "c1", True, order, gates["c1"]))]
        await _settle()
        tasks.append(asyncio.create_task(_take(slots, "r1", False, order, gates["r1"])))  # asked first ...
        await _settle()
        tasks.append(asyncio.create_task(_take(slots, "c2", True, order, gates["c2"])))
        tasks.append(asyncio.create_task(_take(slots, "c3", True, order, gates["c3"])))
        tasks.append(asyncio.create_task(_take(slots, "r2", False, order, gates["r2"])))
        await _settle()
        assert slots.waiting == 2 and order == ["c1"]
        for name in ("c1", "c2", "c3", "r1"):  # ... served after every candidate waiting
            gates[name].set()
            await _settle()
        gates["r2"].set()
        await asyncio.gather(*tasks)
        assert slots.free == 1 and slots.waiting == 0
        return order

    assert asyncio.run(main()) == ["c1", "c2", "c3", "r1", "r2"]


def test_a_retiming_takes_a_free_slot_beside_a_profile_but_waits_for_candidates_being_built():
    """A free slot beside other device work that is not a candidate's (a profile) is the re-timing's; while a
    candidate is in the oracle, being built or on the device, the re-timing waits, and goes once none is."""
    async def main() -> None:
        slots, order = DeviceSlots(2), []
        hold = asyncio.Event()
        profile = asyncio.create_task(_take(slots, "profile", True, order, hold))
        await _settle()
        retime = asyncio.create_task(_take(slots, "r1", False, order, asyncio.Event()))
        await _settle()
        assert order == ["profile", "r1"] and slots.free == 0
        retime.cancel()
        await _settle()

        built = asyncio.Event()

        async def candidate() -> None:  # as the actor's evaluate: counted from its build to its verdict
            async with slots.candidate():
                await built.wait()  # building: no slot asked for yet
                async with slots.held(True):
                    order.append("c1")

        order.clear()
        task = asyncio.create_task(candidate())
        await _settle()
        retime = asyncio.create_task(_take(slots, "r2", False, order, hold))
        await _settle()
        assert order == [] and slots.free == 1 and slots.candidates == 1  # a slot free, but a candidate coming
        built.set()
        await _settle()
        assert order == ["c1", "r2"] and slots.candidates == 0
        hold.set()
        await asyncio.gather(profile, task, retime)

    asyncio.run(main())


def test_a_cancelled_waiter_gives_its_turn_away():
    async def main() -> list[str]:
        slots, order = DeviceSlots(1), []
        gates = {name: asyncio.Event() for name in ("c1", "c2", "r1")}
        first = asyncio.create_task(_take(slots, "c1", True, order, gates["c1"]))
        await _settle()
        cancelled = asyncio.create_task(_take(slots, "c2", True, order, gates["c2"]))
        retime = asyncio.create_task(_take(slots, "r1", False, order, gates["r1"]))
        await _settle()
        cancelled.cancel()
        await _settle()
        gates["c1"].set()
        gates["r1"].set()
        await asyncio.gather(first, retime)
        assert slots.free == 1 and slots.waiting == 0
        return order

    assert asyncio.run(main()) == ["c1", "r1"]

