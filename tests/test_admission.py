"""A device slot is held only with the task pinned among the kept references (oracle.admission), and the
references' small room takes small tasks beside a large one (oracle.reference.ResidentBudget)."""

from __future__ import annotations

import asyncio
import threading

from oracle.admission import Admission
from oracle.device_slots import DeviceSlots
from oracle.reference import References, ReferenceSettings, ResidentBudget, Room
from oracle.timing import TimingParams
from tasks.model import Task

GB = 10**9


def test_small_tasks_fit_in_the_small_room_beside_a_task_that_fills_the_main_one():
    budget = ResidentBudget(21 * GB, small_bytes=3 * GB)
    assert budget.try_pin("level-1", 24 * GB)  # larger than the main room: alone there
    assert budget.try_pin("gemm a", GB // 2) and budget.try_pin("gemm b", 2 * GB)
    assert budget.small_used == GB // 2 + 2 * GB
    assert not budget.try_pin("gemm c", GB)  # the small room is full and the main one too
    assert not budget.try_pin("another level-1", 24 * GB)
    assert budget.try_pin("gemm a", GB // 2)  # a second candidate of a pinned task joins it
    budget.unpin("gemm a")
    budget.unpin("gemm a")
    assert budget.try_pin("gemm c", GB)
    for key in ("level-1", "gemm b", "gemm c"):
        budget.unpin(key)
    assert budget.used == budget.small_used == 0


def test_small_tasks_take_the_small_room_first_so_a_large_one_still_finds_the_main_room_empty():
    budget = ResidentBudget(21 * GB, small_bytes=3 * GB)
    assert budget.try_pin("gemm", GB // 2)
    assert budget.used == 0 and budget.small_used == GB // 2
    assert budget.try_pin("level-1", 24 * GB)
    assert budget.try_pin("conv", 5 * GB) is False  # over the small room, and the main one is taken


def test_a_task_large_in_its_whole_footprint_takes_the_main_room_though_it_keeps_little():
    """A level-1 reduction keeps 2 MB here but its worker holds several times its 4 GB of inputs: in the small
    room it would be judged beside a large task, and an H200 ran out of memory so."""
    budget = ResidentBudget(21 * GB, small_bytes=3 * GB)
    assert budget.try_pin("level-1 elementwise", 24 * GB)
    assert not budget.try_pin("level-1 reduction", 2 * 10**6, small=False)  # the main room is taken: it waits
    assert budget.try_pin("gemm", GB // 2, small=True)
    budget.unpin("level-1 elementwise")
    assert budget.try_pin("level-1 reduction", 2 * 10**6, small=False)
    assert budget.used == 2 * 10**6 and budget.small_used == GB // 2


def _references(tmp_path, small_bytes: int) -> References:
    settings = ReferenceSettings(device="cpu", device_name="cpu", threads=1, check_seeds=(1, 2), extra_size_seed=3,
                                 timing_seeds=(4, 5, 6), init_seed=0, timing=TimingParams(), wants_compile=False,
                                 call_timeout_s=60, time_timeout_s=60, compile_timeout_s=60, budget_bytes=21 * GB,
                                 small_budget_bytes=small_bytes)
    return References(settings, tmp_path / "baselines", alone=None, shared=None, register=None)


def _task(name: str, input_mb: float, output_mb: float) -> Task:
    return Task(id=f"level1/{name}", level=1, problem_id=1, name=name, code=f"# {name}\n", origin="test",
                input_mb=input_mb, output_mb=output_mb)


def test_the_room_of_a_task_says_small_only_when_inputs_outputs_and_kept_references_fit_the_small_room(tmp_path):
    refs = _references(tmp_path, small_bytes=3 * GB)
    try:
        reduction = refs.room(_task("reduction", input_mb=4096, output_mb=2))
        epilogue = refs.room(_task("gemm_epilogue", input_mb=8, output_mb=16))
        elementwise = refs.room(_task("relu", input_mb=3200, output_mb=3200))
        assert reduction.kept_bytes < 100 * 1024**2 and not reduction.small  # keeps little, needs much
        assert epilogue.small and not elementwise.small
        assert reduction.key != epilogue.key != elementwise.key
        assert not _references(tmp_path, small_bytes=0).room(_task("gemm_epilogue", 8, 16)).small  # no small room
    finally:
        refs.close()


def test_without_a_small_room_the_budget_is_one_room_as_before():
    budget = ResidentBudget(100)
    assert budget.try_pin("a", 60) and budget.try_pin("b", 40)
    assert not budget.try_pin("c", 1)
    budget.unpin("a")
    assert budget.try_pin("c", 1)


def test_a_released_task_tells_the_listeners_and_wakes_a_thread_waiting_in_pinned():
    budget = ResidentBudget(100)
    told: list[str] = []
    budget.on_release(lambda: told.append("released"))
    assert budget.try_pin("a", 100)
    entered = threading.Event()

    def waiter() -> None:
        with budget.pinned("b", 100):
            entered.set()

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    assert not entered.wait(0.2)
    budget.unpin("a")
    assert told  # told in the releasing thread, before unpin returns
    assert entered.wait(10)
    thread.join(10)
    assert budget.used == 0 and budget._waiting == {}


def test_the_main_room_is_first_come_first_served_so_a_large_task_is_not_passed_for_ever():
    budget = ResidentBudget(21 * GB, small_bytes=3 * GB)
    assert budget.try_pin("conv a", 10 * GB)
    large, conv = budget.ticket(), budget.ticket()
    assert not budget.try_pin("level-1", 24 * GB, large)  # waits in line for the main room
    assert not budget.try_pin("conv b", 10 * GB, conv)  # fits beside conv a, but the large task came first
    assert budget.try_pin("gemm", GB // 2, budget.ticket())  # the small room is not in the line
    budget.unpin("conv a")
    assert not budget.try_pin("conv b", 10 * GB, conv)
    assert budget.try_pin("level-1", 24 * GB, large)
    budget.unpin("level-1")
    assert budget.try_pin("conv b", 10 * GB, conv)


def test_a_retiming_in_line_never_holds_a_candidate_back_and_yields_to_every_candidate():
    budget = ResidentBudget(100)
    assert budget.try_pin("held", 100)
    retiming, candidate, later_retiming = budget.ticket(), budget.ticket(), budget.ticket()
    assert not budget.try_pin("best", 100, retiming, first_verdict=False)
    assert not budget.try_pin("new", 100, candidate)
    budget.unpin("held")
    assert not budget.try_pin("best", 100, retiming, first_verdict=False)  # a candidate waits: it goes first
    assert budget.try_pin("new", 100, candidate)  # though the re-timing came earlier
    budget.unpin("new")
    assert not budget.try_pin("other best", 100, later_retiming, first_verdict=False)  # among re-timings, in order
    assert budget.try_pin("best", 100, retiming, first_verdict=False)
    budget.unpin("best")
    budget.leave(later_retiming)  # gone while waiting: out of the line
    assert budget._waiting == {} and budget.try_pin("x", 100, budget.ticket())


async def _admitted(admission: Admission, key: str, nbytes: int, first_verdict: bool, inside: asyncio.Event,
                    leave: asyncio.Event, waited: list) -> None:
    async with admission.admitted(Room(key, nbytes, small=True), first_verdict=first_verdict) as w:
        inside.set()
        await leave.wait()
    waited.append(w)


def test_a_candidate_waiting_for_room_holds_no_slot_and_a_small_task_takes_it():
    async def main() -> None:
        slots = DeviceSlots(1)
        budget = ResidentBudget(21 * GB, small_bytes=3 * GB)
        admission = Admission(slots, budget)
        assert budget.try_pin("level-1 a", 24 * GB)  # its candidate is being judged elsewhere
        large_in, large_out, small_in, small_out = (asyncio.Event() for _ in range(4))
        waited: list = []
        large = asyncio.create_task(_admitted(admission, "level-1 b", 24 * GB, True, large_in, large_out, waited))
        await asyncio.sleep(0.05)
        assert not large_in.is_set() and slots.free == 1  # it waits for room, not in the slot
        small = asyncio.create_task(_admitted(admission, "gemm", GB // 2, True, small_in, small_out, waited))
        await asyncio.wait_for(small_in.wait(), 10)
        assert slots.free == 0
        await asyncio.to_thread(budget.unpin, "level-1 a")  # released from another thread
        await asyncio.sleep(0.05)
        assert not large_in.is_set()  # its room is free now, but the slot is the small task's
        small_out.set()
        await asyncio.wait_for(large_in.wait(), 10)
        large_out.set()
        await asyncio.wait_for(asyncio.gather(large, small), 10)
        assert budget.used == budget.small_used == 0 and slots.free == 1
        small_w, large_w = waited
        assert small_w.room_s == 0.0
        assert large_w.room_s > 0.0 and large_w.slot_s > 0.0

    asyncio.run(main())


def test_a_retiming_gives_its_slot_back_while_its_task_does_not_fit():
    async def main() -> None:
        slots = DeviceSlots(1)
        budget = ResidentBudget(100)
        admission = Admission(slots, budget)
        assert budget.try_pin("other", 100)
        inside, leave = asyncio.Event(), asyncio.Event()
        waited: list = []
        retiming = asyncio.create_task(_admitted(admission, "best", 100, False, inside, leave, waited))
        await asyncio.sleep(0.05)
        assert not inside.is_set() and slots.free == 1  # asked for its slot, pinned nothing, gave it back
        budget.unpin("other")
        await asyncio.wait_for(inside.wait(), 10)
        assert slots.free == 0 and budget.used == 100
        leave.set()
        await asyncio.wait_for(retiming, 10)
        assert budget.used == 0 and slots.free == 1 and waited[0].room_s > 0.0

    asyncio.run(main())


def test_a_candidate_cancelled_while_it_waits_leaves_nothing_pinned_or_waiting():
    async def main() -> None:
        slots = DeviceSlots(1)
        budget = ResidentBudget(100)
        admission = Admission(slots, budget)
        async with admission.admitted(Room("first", 100, small=True)) as _:  # holds the room and the only slot
            in_room, in_slot = asyncio.Event(), asyncio.Event()
            for_room = asyncio.create_task(_admitted(admission, "second", 100, True, in_room, asyncio.Event(), []))
            # a candidate of the same task joins the pin, then waits for the slot
            for_slot = asyncio.create_task(_admitted(admission, "first", 100, True, in_slot, asyncio.Event(), []))
            await asyncio.sleep(0.05)
            for task in (for_room, for_slot):
                task.cancel()
            await asyncio.gather(for_room, for_slot, return_exceptions=True)
            assert admission._waiters and len(admission._waiters) == 1  # only the holder's own
        assert budget.used == 0 and slots.free == 1 and not admission._waiters and budget._waiting == {}
        async with admission.admitted(Room("second", 100, small=True)):  # the room and the slot are there for the next
            assert budget.used == 100

    asyncio.run(main())
