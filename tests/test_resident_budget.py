"""The reference process's memory for tasks in use (oracle.reference.ResidentBudget): candidates of large
tasks take turns instead of pinning more reference outputs than the budget holds."""

from __future__ import annotations

import threading

from oracle.reference import ResidentBudget


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
