"""Checks overlap, timing holds the device alone (oracle/device_lock.py and its use in Oracle.check_and_time)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from oracle import Oracle, OracleConfig
from oracle.device_lock import DeviceLock
from oracle.harness import build_entry
from oracle.sandbox import Worker, _descendants
from oracle.timing import TimingParams
from tasks import Selection, load_tasks

CANDIDATES = Path(__file__).parent / "candidates"


class Recording(DeviceLock):
    """A DeviceLock that logs who held it, for the overlap checks below."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[float, str, str]] = []
        self._log = threading.Lock()

    def _mark(self, kind: str, what: str) -> None:
        with self._log:
            self.events.append((time.perf_counter(), kind, what))

    def shared(self):
        parent = super().shared()

        class _Ctx:
            def __enter__(ctx):
                parent.__enter__()
                self._mark("shared", "in")

            def __exit__(ctx, *exc):
                self._mark("shared", "out")
                return parent.__exit__(*exc)

        return _Ctx()

    def exclusive(self, label: str = "timing"):
        parent = super().exclusive(label)

        class _Ctx:
            def __enter__(ctx):
                parent.__enter__()
                self._mark("exclusive", "in")

            def __exit__(ctx, *exc):
                self._mark("exclusive", "out")
                return parent.__exit__(*exc)

        return _Ctx()

    def max_holders(self) -> tuple[int, bool]:
        """Most shared holders at once, and whether an exclusive holder ever had company."""
        shared = exclusive = most = 0
        crowded = False
        for _, kind, what in sorted(self.events):
            delta = 1 if what == "in" else -1
            if kind == "shared":
                shared += delta
            else:
                exclusive += delta
            most = max(most, shared)
            crowded = crowded or (exclusive > 0 and (shared > 0 or exclusive > 1))
        return most, crowded


def test_shared_holders_overlap_and_exclusive_waits_for_them():
    lock = Recording()
    inside = threading.Barrier(3, timeout=5)

    def check():
        with lock.shared():
            inside.wait()  # all three checks inside at once, or this times out
            time.sleep(0.05)

    threads = [threading.Thread(target=check) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.01)
    with lock.exclusive():
        pass
    for t in threads:
        t.join()
    most, crowded = lock.max_holders()
    assert most == 3 and not crowded
    assert lock.busy_s > 0.04


def test_a_waiting_timer_goes_before_new_checks():
    lock = DeviceLock()
    order: list[str] = []
    first_in = threading.Event()

    def long_check():
        with lock.shared():
            first_in.set()
            time.sleep(0.3)

    def timer():
        with lock.exclusive():
            order.append("timed")

    def late_check():
        with lock.shared():
            order.append("late check")

    a = threading.Thread(target=long_check)
    a.start()
    first_in.wait(5)
    b = threading.Thread(target=timer)
    b.start()
    time.sleep(0.05)  # the timer is waiting now
    c = threading.Thread(target=late_check)
    c.start()
    for t in (a, b, c):
        t.join(5)
    assert order == ["timed", "late check"]


def test_busy_time_counts_overlapping_holders_once():
    lock = DeviceLock()

    def hold():
        with lock.shared():
            time.sleep(0.2)

    started = time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: hold(), range(4)))
    wall = time.perf_counter() - started
    assert 0.18 <= lock.busy_s <= wall + 0.01  # four overlapping holds of 0.2 s are 0.2 s busy, not 0.8


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_timing_alone_stops_the_other_candidates_workers(tmp_path):
    """While one candidate is timed, every other live candidate worker is stopped (SIGSTOP), its own is not,
    and all run again afterwards."""
    oracle = Oracle(OracleConfig(device="cpu", cache_dir=tmp_path))
    job = {"cache": str(tmp_path), "candidate_path": "wait.py", "build_timeout_s": 60}
    workers = [Worker(build_entry, job, files={"wait.py": "import time\ntime.sleep(60)\n"}) for _ in range(2)]
    try:
        for w in workers:
            deadline = time.monotonic() + 30
            while os.getpgid(w.process.pid) != w.process.pid and time.monotonic() < deadline:  # in its own group
                time.sleep(0.05)
        oracle.quiet._workers.update(workers)
        mine, other = workers
        with oracle.alone(mine):
            time.sleep(0.2)
            assert _state(other.process.pid) == "T" and _state(mine.process.pid) != "T"
        time.sleep(0.2)
        assert _state(other.process.pid) != "T"
    finally:
        for w in workers:
            w.close()


def _group(pid: int) -> list[int]:
    """The processes of the group `pid` leads."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pid:
                    found.append(int(entry.name))
            except ProcessLookupError:
                pass
    return found


def _start_in_own_group(worker: Worker) -> None:
    deadline = time.monotonic() + 30
    while os.getpgid(worker.process.pid) != worker.process.pid and time.monotonic() < deadline:
        time.sleep(0.05)


# A stand-in build: a worker that starts a child process (as a build starts ninja and g++) and waits.
FORKS = "import subprocess, time\nsubprocess.Popen(['sleep', '60'])\ntime.sleep(60)\n"


@pytest.mark.parametrize(("device", "stop"), [("cpu", True), ("cpu", False), ("cuda", True)])
def test_on_a_cpu_timing_stops_builds_and_header_makers(tmp_path, device, stop):
    """On a CPU the compilers share the cores being timed: a build worker with its children, and a detached
    header maker, are stopped while something is timed and run on afterwards. On a GPU, or when the user
    turns it off, they run on."""
    oracle = Oracle(OracleConfig(device=device, cache_dir=tmp_path, stop_builds_while_timing=stop))
    job = {"cache": str(tmp_path), "candidate_path": "build.py", "build_timeout_s": 60}
    builder = Worker(build_entry, job, files={"build.py": FORKS})
    maker = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        _start_in_own_group(builder)
        deadline = time.monotonic() + 30
        while len(_group(builder.process.pid)) < 2 and time.monotonic() < deadline:  # its child has started
            time.sleep(0.05)
        compilers = [*_group(builder.process.pid), maker.pid]
        assert len(compilers) == 3
        oracle.quiet._builders.add(builder)
        oracle.quiet._header_makers.append(maker)
        with oracle.alone(None):
            time.sleep(0.2)
            states = {_state(pid) for pid in compilers}
            assert states == {"T"} if device == "cpu" and stop else "T" not in states, states
        time.sleep(0.2)
        assert "T" not in {_state(pid) for pid in compilers}
    finally:
        builder.close()
        maker.kill()
        maker.wait()


def test_a_compiler_starting_during_a_timing_is_stopped_until_it_ends(tmp_path):
    """A build slot freed during a timing starts the next build at once: that build (and a header maker
    asked for meanwhile) must not run beside the timing either."""
    oracle = Oracle(OracleConfig(device="cpu", cache_dir=tmp_path))
    job = {"cache": str(tmp_path), "candidate_path": "build.py", "build_timeout_s": 60}
    builder, maker = None, None
    try:
        with oracle.alone(None):
            builder = Worker(build_entry, job, files={"build.py": FORKS})
            oracle.quiet._register_compiler(builder.process.pid, lambda: oracle.quiet._builders.add(builder))
            maker = subprocess.Popen(["sleep", "60"], start_new_session=True)
            oracle.quiet.header_maker(maker)
            time.sleep(0.5)
            assert _state(builder.process.pid) == "T" and _state(maker.pid) == "T"
            assert len(_group(builder.process.pid)) <= 1  # stopped before it could start its child
        time.sleep(0.2)
        assert _state(builder.process.pid) != "T" and _state(maker.pid) != "T"
        deadline = time.monotonic() + 30
        while len(_descendants(builder.process.pid)) < 1 and time.monotonic() < deadline:  # it goes on
            time.sleep(0.05)
        assert _descendants(builder.process.pid)
    finally:
        if builder is not None:
            builder.close()
        if maker is not None:
            maker.kill()
            maker.wait()


@pytest.mark.slow
def test_a_real_cpu_build_pauses_while_a_candidate_is_timed(tmp_path):
    """`Oracle.build` registers its worker: while the device is held alone, the C++ compiler it runs makes
    no progress (its CPU time stands still), and the build still succeeds afterwards."""
    task = load_tasks("builtin", Selection(task_ids=frozenset({"builtin/1_LeakyReLU_Scale"})), 256).tasks[0]
    oracle = Oracle(OracleConfig(device="cpu", cache_dir=tmp_path, precompiled_headers=False))
    candidate = oracle.extract(task, (CANDIDATES / "leaky_correct.py").read_text())
    with ThreadPoolExecutor(1) as pool:
        build = pool.submit(oracle.build, candidate)
        compiler = None
        deadline = time.monotonic() + 120
        while compiler is None and time.monotonic() < deadline and not build.done():
            for w in list(oracle.quiet._builders):
                for pid in _descendants(w.process.pid):  # ninja starts the compiler in a group of its own
                    try:
                        if Path(f"/proc/{pid}/comm").read_text().strip() == "cc1plus":
                            compiler = pid
                    except FileNotFoundError:
                        pass
            time.sleep(0.1)
        assert compiler is not None, "no compiler seen while building"

        def cpu_ticks() -> int:
            fields = Path(f"/proc/{compiler}/stat").read_text().rsplit(")", 1)[1].split()
            return int(fields[11]) + int(fields[12])  # utime + stime

        with oracle.alone(None):
            time.sleep(0.3)
            before = cpu_ticks()
            time.sleep(1.0)
            assert _state(compiler) == "T" and cpu_ticks() == before
        outcome = build.result(timeout=900)
    assert outcome.ok and not oracle.quiet._builders, outcome.message


@pytest.mark.slow
def test_candidates_checked_together_are_timed_alone(tmp_path):
    """Two CPU candidates with two device slots: their checks may overlap, their timing never overlaps
    anything, and both verdicts are what they are when judged one at a time."""
    task = load_tasks("builtin", Selection(task_ids=frozenset({"builtin/1_LeakyReLU_Scale"})), 256).tasks[0]
    fast = TimingParams(warmup_calls=2, min_calls=5, max_calls=20, target_s=0.2, wall_calls=5)
    oracle = Oracle(OracleConfig(device="cpu", cache_dir=tmp_path, timing=fast, call_timeout_s=30, check_slots=2))
    oracle.quiet.lock = Recording()
    sources = [(CANDIDATES / "leaky_correct.py").read_text(), (CANDIDATES / "leaky_wrong_slope.py").read_text()]
    with ThreadPoolExecutor(2) as pool:
        verdicts = list(pool.map(lambda text: oracle.evaluate(task, text), sources))
    assert [v.status for v in verdicts] == ["correct", "incorrect"], [v.message for v in verdicts]
    most, crowded = oracle.quiet.lock.max_holders()
    assert not crowded
    assert any(kind == "exclusive" for _, kind, _ in oracle.quiet.lock.events)  # the baselines and the timing
    assert oracle.standby.waiting == 2  # a worker started ahead of the next candidate, per device slot
    oracle.close()
    assert oracle.quiet.idle  # every worker closed and forgotten


def test_memory_budget_lets_a_worker_start_only_when_its_estimate_fits():
    """Two workers of a task with GB-sized tensors must not be promised more device memory than there is;
    one alone always starts, even when its estimate is larger than the whole budget."""
    from oracle.device_quiet import MemoryBudget

    budget = MemoryBudget(100)
    entered, leave = threading.Event(), threading.Event()

    def second():
        with budget.reserve(60):
            entered.set()
            leave.wait(10)

    with budget.reserve(60):
        other = threading.Thread(target=second)
        other.start()
        assert not entered.wait(0.3)  # 60 + 60 > 100: the second waits
        assert budget.used == 60
    assert entered.wait(5)  # and starts once the first is done
    assert budget.used == 60
    leave.set()
    other.join(5)
    assert budget.used == 0
    lone = MemoryBudget(10)
    with lone.reserve(500):  # larger than the budget, but alone: it starts
        assert lone.used == 10


def _until(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.005)


@pytest.mark.parametrize("in_order", [True, False])
def test_an_in_order_memory_budget_lets_no_later_request_overtake_a_waiting_one(in_order):
    """The torch.compile baselines' budget: a timing promise of nearly the whole share waits for room, and
    the compile promises asked for after it, which would fit, wait behind it (in order) instead of keeping
    the room taken forever. The budget of candidates' workers lets a fitting one through (not in order)."""
    from oracle.device_quiet import MemoryBudget

    budget = MemoryBudget(100, in_order=in_order)
    entered: list[str] = []
    release = {name: threading.Event() for name in ("large", "small")}

    def hold(name: str, nbytes: int) -> None:
        with budget.reserve(nbytes):
            entered.append(name)
            release[name].wait(10)

    with budget.reserve(40):
        large = threading.Thread(target=hold, args=("large", 90))
        large.start()
        _until(lambda: budget.waiting == 1)  # 40 + 90 > 100: it waits
        small = threading.Thread(target=hold, args=("small", 30))  # 40 + 30 fits
        small.start()
        if in_order:
            _until(lambda: budget.waiting == 2)  # behind the large one
            assert entered == []
        else:
            _until(lambda: entered == ["small"])
            release["small"].set()
    _until(lambda: "large" in entered)
    assert budget.used == 90 and entered[0] == ("large" if in_order else "small")
    release["large"].set()
    release["small"].set()
    large.join(5)
    small.join(5)
    assert entered == (["large", "small"] if in_order else ["small", "large"]) and budget.used == 0 and budget.waiting == 0


def test_a_request_asked_ahead_goes_before_the_waiting_ones_not_so_asked_and_after_those_that_were():
    """A compiled torch.compile worker's timing promise does not wait behind every compile promise asked
    before it; two timing promises keep their own order."""
    from oracle.device_quiet import MemoryBudget

    budget = MemoryBudget(100, in_order=True)
    entered: list[str] = []

    def hold(name: str, nbytes: int, ahead: bool) -> None:
        with budget.reserve(nbytes, ahead=ahead):
            entered.append(name)

    threads = []
    with budget.reserve(90):
        # 60 each: no two fit at once, so each enters (and says so) only after the one before it has left
        for i, (name, ahead) in enumerate([("compile 1", False), ("compile 2", False), ("timing 1", True),
                                           ("compile 3", False), ("timing 2", True)]):
            threads.append(threading.Thread(target=hold, args=(name, 60, ahead)))
            threads[-1].start()
            _until(lambda: budget.waiting == i + 1)
    for thread in threads:
        thread.join(5)
    assert entered == ["timing 1", "timing 2", "compile 1", "compile 2", "compile 3"]
    assert budget.used == 0 and budget.waiting == 0


def test_a_budget_borrows_from_its_lender_only_while_lent_and_only_what_is_free_there():
    """The compile baselines' budget, full, borrows the candidates' free memory while the oracle lends it
    (no candidate being built): the borrowed bytes count in the lender until they are returned, a
    candidate that then does not fit waits for them, and nothing is borrowed past the lender's room, past a
    candidate waiting there, or once lending stopped."""
    from oracle.device_quiet import MemoryBudget

    compile_budget, candidates = MemoryBudget(100, in_order=True), MemoryBudget(200)
    entered: list[str] = []
    borrowed: dict[str, bool] = {}
    release = {name: threading.Event() for name in ("baseline", "later", "candidate")}

    def hold(budget: MemoryBudget, name: str, nbytes: int) -> None:
        with budget.reserve(nbytes) as lent:
            borrowed[name] = lent
            entered.append(name)
            release[name].wait(10)

    with compile_budget.reserve(60):
        baseline = threading.Thread(target=hold, args=(compile_budget, "baseline", 90))
        baseline.start()
        _until(lambda: compile_budget.waiting == 1)  # 60 + 90 > 100, and nothing is lent yet
        time.sleep(0.3)
        assert entered == []
        compile_budget.lend_from(candidates)
        _until(lambda: entered == ["baseline"])  # promised from the candidates' 200
        assert candidates.used == 90 and compile_budget.used == 60 and compile_budget.borrowed == 90
        candidate = threading.Thread(target=hold, args=(candidates, "candidate", 150))  # 90 + 150 > 200
        candidate.start()
        _until(lambda: candidates.waiting == 1)
        later = threading.Thread(target=hold, args=(compile_budget, "later", 50))  # fits neither: a candidate waits
        later.start()
        _until(lambda: compile_budget.waiting == 1)
        time.sleep(0.6)  # the lender is looked at again every LEND_POLL_S
        assert entered == ["baseline"]
        compile_budget.lend_from(None)
        release["baseline"].set()  # returned: the candidate goes in
        _until(lambda: entered == ["baseline", "candidate"])
        assert candidates.used == 150 and compile_budget.borrowed == 0
        time.sleep(0.6)
        assert "later" not in entered  # not lent any more, and its own share is still taken
    _until(lambda: entered == ["baseline", "candidate", "later"])
    assert compile_budget.used == 50
    for event in release.values():
        event.set()
    for thread in (baseline, candidate, later):
        thread.join(5)
    assert compile_budget.used == candidates.used == compile_budget.borrowed == 0
    assert borrowed == {"baseline": True, "candidate": False, "later": False}  # what `reserve` said


def test_the_time_held_alone_is_counted_by_what_held_it():
    lock = DeviceLock()
    for label in ("candidate timing", "candidate timing", "eager baseline"):
        with lock.exclusive(label):
            time.sleep(0.02)
    with lock.shared():
        time.sleep(0.02)
    assert {k: n for k, (_, n) in lock.exclusive_by.items()} == {"candidate timing": 2, "eager baseline": 1}
    assert lock.exclusive_by["candidate timing"][0] >= 0.04 and lock.exclusive_by["eager baseline"][0] >= 0.02
    assert lock.exclusive_s == pytest.approx(sum(s for s, _ in lock.exclusive_by_now().values()))
    assert lock.busy_s >= lock.exclusive_s + 0.02
