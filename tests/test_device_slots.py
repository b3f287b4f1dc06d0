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



def _pinned(budget, key: str, nbytes: int):
    return lambda: budget.pinned(key, nbytes)


async def _turn(slots: DeviceSlots, room, threads, name: str, order: list[str], release: asyncio.Event,
                waits: dict[str, dict[str, float]], first_verdict: bool = True) -> None:
    async with slots.turn(room, threads, first_verdict) as waited:
        order.append(name)
        waits[name] = waited
        await release.wait()


async def _until(condition, timeout_s: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out waiting"
        await asyncio.sleep(0.01)


def test_a_candidate_waiting_for_room_for_its_reference_holds_no_slot():
    """A candidate whose task does not fit beside the references in use waits for room without a slot, so a
    candidate of a task already in goes first (with the slot taken first, it queued behind the waiting one)."""
    from concurrent.futures import ThreadPoolExecutor

    from oracle.reference import ResidentBudget

    async def main() -> tuple[list[str], dict[str, dict[str, float]], ResidentBudget]:
        budget, slots, order, waits = ResidentBudget(10), DeviceSlots(1), [], {}
        gates = {name: asyncio.Event() for name in ("a1", "b1", "a2")}
        with ThreadPoolExecutor(4) as threads:
            a1 = asyncio.create_task(_turn(slots, _pinned(budget, "A", 10), threads, "a1", order, gates["a1"], waits))
            await _until(lambda: order == ["a1"])
            b1 = asyncio.create_task(_turn(slots, _pinned(budget, "B", 10), threads, "b1", order, gates["b1"], waits))
            await asyncio.sleep(0.2)  # b1 now waits for room (A fills the budget)
            a2 = asyncio.create_task(_turn(slots, _pinned(budget, "A", 10), threads, "a2", order, gates["a2"], waits))
            await _until(lambda: slots.waiting == 1)  # a2 joined A's room and waits for the one slot
            gates["a1"].set()
            await _until(lambda: len(order) == 2)
            assert order == ["a1", "a2"] and budget.used == 10
            gates["a2"].set()
            await _until(lambda: len(order) == 3)
            gates["b1"].set()
            await asyncio.gather(a1, b1, a2)
        return order, waits, budget

    order, waits, budget = asyncio.run(main())
    assert order == ["a1", "a2", "b1"]
    assert waits["b1"]["reference_memory"] >= 0.2  # recorded as a wait for room, not for the slot
    assert budget.used == 0


def test_a_turn_cancelled_while_waiting_for_room_leaves_nothing_held():
    from concurrent.futures import ThreadPoolExecutor

    from oracle.reference import ResidentBudget

    async def main() -> ResidentBudget:
        budget, slots, order, waits = ResidentBudget(10), DeviceSlots(1), [], {}
        release = asyncio.Event()
        with ThreadPoolExecutor(2) as threads:
            a1 = asyncio.create_task(_turn(slots, _pinned(budget, "A", 10), threads, "a1", order, release, waits))
            await _until(lambda: order == ["a1"])
            b1 = asyncio.create_task(_turn(slots, _pinned(budget, "B", 10), threads, "b1", order, release, waits))
            await asyncio.sleep(0.2)
            b1.cancel()
            release.set()
            await a1
            await _until(lambda: budget.used == 0)  # B got its room once A left, and gave it back at once
            assert order == ["a1"] and slots.free == 1
        return budget

    assert asyncio.run(main()).used == 0


def test_a_retiming_takes_its_slot_without_room():
    from concurrent.futures import ThreadPoolExecutor

    from oracle.reference import ResidentBudget

    async def main() -> None:
        budget, slots, order, waits = ResidentBudget(10), DeviceSlots(1), [], {}
        release = asyncio.Event()
        with budget.pinned("A", 10), ThreadPoolExecutor(1) as threads:  # the budget full
            retime = asyncio.create_task(_turn(slots, _pinned(budget, "B", 10), threads, "r1", order, release, waits,
                                               first_verdict=False))
            await _until(lambda: order == ["r1"])
            assert budget.used == 10 and waits["r1"]["reference_memory"] == 0.0
            release.set()
            await retime

    asyncio.run(main())


def test_closing_the_budget_ends_the_waits_for_room():
    """A thread waiting for room when the oracle closes raises instead of waiting on: it would keep the
    oracle's process from exiting."""
    import threading

    import pytest

    from oracle.reference import ReferenceError, ResidentBudget

    budget, failures = ResidentBudget(10), []

    def wait_for_room() -> None:
        try:
            with budget.pinned("B", 10):
                pass
        except ReferenceError as exc:
            failures.append(str(exc))

    with budget.pinned("A", 10):
        waiter = threading.Thread(target=wait_for_room)
        waiter.start()
        waiter.join(0.2)
        assert waiter.is_alive()
        budget.close()
        waiter.join(30)
        assert not waiter.is_alive() and failures == ["the reference process is closed"]
    with pytest.raises(ReferenceError):
        with budget.pinned("C", 1):
            pass
