"""The reference process's memory for tasks in use (oracle.reference.ResidentBudget): candidates of large
tasks take turns instead of pinning more reference outputs than the budget holds."""

from __future__ import annotations

import multiprocessing
import threading

import pytest
import torch

from oracle import Oracle, OracleConfig
from oracle.device_quiet import MeasuredPeaks
from oracle.protocol import Case, PrepareTask
from oracle.reference import ReferenceError, ResidentBudget
from oracle.reference_server import ReferenceState, TaskReference
from tasks import Selection, load_tasks


class Holder:
    """A candidate's thread: pins `key`, says so, and holds the pin until released."""

    def __init__(self, budget: ResidentBudget, key: str, nbytes: int) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run, args=(budget, key, nbytes), daemon=True)
        self.thread.start()

    def _run(self, budget: ResidentBudget, key: str, nbytes: int) -> None:
        with budget.pinned(key, nbytes):
            self.entered.set()
            self.release.wait(30)

    def done(self) -> None:
        self.release.set()
        self.thread.join(30)


def test_a_task_that_does_not_fit_beside_the_pinned_ones_waits_for_them():
    budget = ResidentBudget(100)
    a = Holder(budget, "a", 70)
    assert a.entered.wait(10)
    b = Holder(budget, "b", 70)
    assert not b.entered.wait(0.3)  # 70 + 70 > 100: b waits while a is pinned
    a.done()
    assert b.entered.wait(10)
    b.done()
    assert budget.used == 0


def test_candidates_of_one_task_share_its_pin_and_small_tasks_fit_beside():
    budget = ResidentBudget(100)
    holders = [Holder(budget, "a", 60) for _ in range(3)] + [Holder(budget, "b", 40)]
    assert all(h.entered.wait(10) for h in holders)  # 60 once for task a, + 40: all fit, none waits
    assert budget.used == 100
    for h in holders:
        h.done()
    assert budget.used == 0


def test_closing_ends_the_waits_for_room_and_later_pins_fail():
    """A thread waiting for room when the oracle closes raises instead of waiting on: a thread left waiting
    would keep the oracle's process from exiting (as threads left preparing did, for an hour)."""
    budget, failures = ResidentBudget(100), []

    def wait_for_room() -> None:
        try:
            with budget.pinned("b", 70):
                pass
        except ReferenceError as exc:
            failures.append(str(exc))

    a = Holder(budget, "a", 70)
    assert a.entered.wait(10)
    waiter = threading.Thread(target=wait_for_room, daemon=True)
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive()  # 70 + 70 > 100: it waits
    budget.close()
    waiter.join(30)
    assert not waiter.is_alive() and failures == ["the reference process is closed"]
    with pytest.raises(ReferenceError):
        with budget.pinned("c", 1):
            pass
    a.done()
    assert budget.used == 0


def test_one_task_larger_than_the_budget_still_runs_alone():
    budget = ResidentBudget(100)
    huge = Holder(budget, "huge", 10_000)
    assert huge.entered.wait(10) and budget.used == 100
    other = Holder(budget, "other", 1)
    assert not other.entered.wait(0.3)
    huge.done()
    assert other.entered.wait(10)
    other.done()
    assert budget.used == 0


# ---------------------------------------------------------------- the reference process's side


def _kept(state: ReferenceState, key: str, nbytes: int, sessions: int = 0) -> None:
    """A task kept in the reference process with `nbytes` of outputs (the other fields are not read here)."""
    state.tasks[key] = TaskReference(request=None, modules=[], models=[], outputs=[[torch.zeros(nbytes, dtype=torch.uint8)]],
                                     timing_outputs=[], prepared=None, sessions=sessions)


def test_idle_tasks_make_room_before_a_new_one_is_made_not_after():
    # Dropped only after the new task was made, the idle ones and the new one were all on the device at
    # once: an H200's reference process reserved 80 GB against a budget of 21.
    state = ReferenceState("cpu", budget_bytes=100)
    _kept(state, "old", 40)
    _kept(state, "in use", 40, sessions=1)
    _kept(state, "newest", 10)
    state._evict(room_for=40)
    assert list(state.tasks) == ["in use", "newest"]  # 40 + 10 + 40 fits: the least recently used went
    state._evict(room_for=60)
    assert list(state.tasks) == ["in use"]  # the newest too when the room asked for needs it; never one in use
    state._evict(room_for=90)
    assert list(state.tasks) == ["in use"]


def test_after_a_task_is_made_the_newest_stays_even_over_budget():
    state = ReferenceState("cpu", budget_bytes=100)
    _kept(state, "a", 60)
    _kept(state, "b", 70)
    state._evict()
    assert list(state.tasks) == ["b"]


def test_a_task_not_yet_made_is_guessed_from_its_outputs_measured_on_the_meta_device(tmp_path, kernelbench_jsonl):
    # Inputs x sets guessed 32 GB for a level-1 reduction whose outputs take 2 MB a set: its first
    # preparation pinned the whole budget and made every idle task go.
    config = OracleConfig(device="cpu", cache_dir=tmp_path)
    oracle = Oracle(config)
    try:
        (reduction,) = load_tasks(kernelbench_jsonl, Selection(task_ids=frozenset({"level1/47_Sum_reduction_over_a_dimension"})),
                                  max_input_mb=64).tasks
        assert reduction.input_mb > 30 * reduction.output_mb > 0
        refs = oracle.references
        sets = len(refs.settings.check_seeds) + 1 + len(refs.timing_seeds(reduction))
        guess = refs._kept_bytes(reduction, refs.key(reduction))
        assert guess == int(sets * reduction.output_mb * 2**20 * 2)  # with the float64 corrections beside
        oracle.evaluate(reduction, "no code here")  # nothing prepared: still a guess
        assert refs._kept_bytes(reduction, refs.key(reduction)) == guess
    finally:
        oracle.close()


def test_preparing_a_task_drops_the_idle_ones_first():
    state = ReferenceState("cpu", budget_bytes=1)  # nothing fits beside anything
    tasks = load_tasks("builtin", None, 1).tasks[:2]
    seen: list[list[str]] = []
    evict = state._evict

    def spy(room_for: int = 0) -> None:
        seen.append(list(state.tasks))
        evict(room_for)

    state._evict = spy
    parent, child = multiprocessing.Pipe()
    for i, task in enumerate(tasks):
        request = PrepareTask(key=f"t{i}", task_id=task.id, codes=[task.code], cases=[Case(0, 1).to_json()],
                              timing_seeds=[2], init_seed=0, call_timeout_s=60, expected_bytes=1)
        prepared = state.prepare(request, child)
        assert prepared.kept_bytes == state.tasks[f"t{i}"].nbytes > 0
    # the first task was still there when the second asked for room, and gone before it was made
    assert seen[2] == ["t0"] and seen[3] == ["t1"]
    parent.close()
    child.close()


def test_a_tasks_next_workers_are_promised_what_its_workers_were_measured_to_hold():
    peaks = MeasuredPeaks()
    assert peaks.promise("relu", 27) == 27  # nothing measured yet: the estimate
    peaks.measured("relu", 42)
    peaks.measured("relu", 40)
    assert peaks.promise("relu", 27) == 42 and peaks.promise("relu", 50) == 50
    assert peaks.promise("softmax", 27) == 27  # per task
