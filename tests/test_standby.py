"""Workers started ahead of their candidates (oracle.standby): taken by the next candidate, replaced behind
it, never reused, stopped while something is timed, and closed with the oracle."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from oracle import Oracle, OracleConfig
from oracle.timing import TimingParams
from tasks import Selection, load_tasks

FAST = TimingParams(warmup_calls=1, min_calls=3, max_calls=5, target_s=0.05, wall_calls=3)

# Right for builtin/1_LeakyReLU_Scale; writes the pid of the process it runs in.
PID_WRITER = '''
import os
import torch
import torch.nn as nn

open({path!r}, "w").write(str(os.getpid()))

class ModelNew(nn.Module):
    def __init__(self, *args):
        super().__init__()

    def forward(self, x):
        return torch.where(x >= 0, x, x * negative_slope) * scale
'''


@pytest.fixture()
def oracle(tmp_path):
    o = Oracle(OracleConfig(device="cpu", cache_dir=tmp_path / "cache", allow_torch=True, timing=FAST))
    yield o
    o.close()


@pytest.fixture(scope="module")
def task():
    return load_tasks("builtin", Selection(task_ids=frozenset({"builtin/1_LeakyReLU_Scale"})), 8).tasks[0]


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _waiting_pid(oracle: Oracle) -> int:
    assert oracle.standby.waiting == 1
    return oracle.standby._ready[0][0].process.pid


def test_a_candidate_runs_in_the_worker_started_ahead_of_it_and_another_starts_behind(oracle, task, tmp_path):
    first = oracle.evaluate(task, PID_WRITER.format(path=str(tmp_path / "first")), "torch")
    assert first.status == "correct", first.message
    ready = _waiting_pid(oracle)  # started while the first candidate was judged
    second = oracle.evaluate(task, PID_WRITER.format(path=str(tmp_path / "second")), "torch")
    assert second.status == "correct", second.message
    assert int((tmp_path / "second").read_text()) == ready
    assert int((tmp_path / "first").read_text()) != ready
    assert _waiting_pid(oracle) not in (ready, int((tmp_path / "first").read_text()))  # never reused


def test_a_waiting_worker_that_died_is_passed_over(oracle, task, tmp_path):
    oracle.evaluate(task, PID_WRITER.format(path=str(tmp_path / "first")), "torch")
    dead = _waiting_pid(oracle)
    os.kill(dead, 9)
    deadline = time.monotonic() + 30
    while oracle.standby._ready[0][0].process.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    v = oracle.evaluate(task, PID_WRITER.format(path=str(tmp_path / "second")), "torch")
    assert v.status == "correct", v.message
    assert int((tmp_path / "second").read_text()) != dead
    assert oracle.standby.waiting == 1


def test_waiting_workers_are_stopped_while_something_is_timed_and_closed_with_the_oracle(oracle, task, tmp_path):
    oracle.evaluate(task, PID_WRITER.format(path=str(tmp_path / "first")), "torch")
    ready = _waiting_pid(oracle)
    with oracle.alone():
        deadline = time.monotonic() + 30  # a stop takes effect when the process next runs
        while _state(ready) != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _state(ready) == "T"
    assert _state(ready) != "T"
    oracle.close()
    assert oracle.standby.waiting == 0 and oracle.quiet.idle
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{ready}") and _state(ready) != "Z" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not os.path.exists(f"/proc/{ready}") or _state(ready) == "Z"


def test_a_worker_started_while_something_is_timed_starts_stopped(oracle, task, tmp_path):
    with oracle.alone():
        oracle.standby.fill()  # as a candidate's check_and_time does, beside another's timing
        started = _waiting_pid(oracle)
        deadline = time.monotonic() + 30
        while _state(started) != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _state(started) == "T"
    assert _state(started) != "T"
    v = oracle.evaluate(task, PID_WRITER.format(path=str(tmp_path / "first")), "torch")
    assert v.status == "correct", v.message
    assert int((tmp_path / "first").read_text()) == started


def test_a_candidate_that_needs_its_own_environment_gets_a_fresh_worker(oracle, task, tmp_path):
    oracle.standby.fill()
    ready = _waiting_pid(oracle)
    worker = oracle.standby.take({"device": "cpu"}, {}, env={"TRITON_INTERPRET": "1"})
    try:
        assert worker.process.pid != ready and _waiting_pid(oracle) == ready
    finally:
        worker.close()


def test_no_workers_wait_when_the_oracle_is_told_to_keep_none(task, tmp_path):
    o = Oracle(OracleConfig(device="cpu", cache_dir=tmp_path / "cache", allow_torch=True, timing=FAST, standby_workers=0))
    try:
        v = o.evaluate(task, PID_WRITER.format(path=str(tmp_path / "first")), "torch")
        assert v.status == "correct", v.message
        assert o.standby.waiting == 0
    finally:
        o.close()


def test_a_waiting_worker_whose_set_up_failed_is_replaced_by_a_fresh_start(oracle):
    """A standby that cannot set up its device (CUDA on this CPU machine) ends its side of the pipe and waits
    to be killed; the candidate that would have taken it gets a worker started the ordinary way."""
    from oracle.standby import StandbyWorkers

    pool = StandbyWorkers("cuda", 1, oracle.quiet.running)
    try:
        pool.fill()
        failing = pool._ready[0][0]
        deadline = time.monotonic() + 60
        while not failing.conn.poll(0) and time.monotonic() < deadline:  # its set-up failed: its pipe ends
            time.sleep(0.01)
        assert failing.conn.poll(0)
        worker = pool.take({"device": "cpu"}, {})
        try:
            assert worker.process.pid != failing.process.pid
        finally:
            worker.close()
    finally:
        pool.close()


SLOW = '''
import time
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self, *args):
        super().__init__()

    def forward(self, x):
        time.sleep(0.2)  # far slower than eager
        return torch.where(x >= 0, x, x * negative_slope) * scale
'''


def _judged_in_plain_torch(task, code: str, params: TimingParams, tmp_path: Path):
    """The verdict of a plain-PyTorch candidate from a CPU oracle of its own: correct, or the test fails."""
    o = Oracle(OracleConfig(device="cpu", cache_dir=tmp_path / "cache", allow_torch=True, timing=params))
    try:
        v = o.evaluate(task, code, "torch")
    finally:
        o.close()
    assert v.status == "correct", v.message
    return v


def test_the_clocked_block_of_a_kernel_slower_than_eager_is_sized_by_its_own_time(task, tmp_path):
    """Sized from eager alone, the block of a kernel 1000x slower than eager held the device for minutes.
    With 10 calls a block, eager (a few ms here) asks for 10; a kernel of 200 ms or more gets the 0.2-s cut's
    floor of 3 calls, whatever eager's time and however loaded the machine (a 50-ms kernel that a loaded
    machine stretched past 67 ms also came to 3, so the figure must not depend on the load)."""
    params = TimingParams(warmup_calls=1, min_calls=3, max_calls=5, target_s=0.05, wall_calls=10)
    v = _judged_in_plain_torch(task, SLOW, params, tmp_path)
    assert params.wall_block(200.0) == 3 and v.timing["candidate"]["block_calls"] == 3
    assert v.timing["candidate"]["external_ms"] >= 200.0
    assert v.timing["candidate"]["block_rounds"] == 1  # a round of 0.6 s: a host's delays do not show


TINY_TASK = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return x * 2

def get_inputs():
    return [torch.randn(64)]

def get_init_inputs():
    return []
'''

TINY = '''
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self, *args):
        super().__init__()

    def forward(self, x):
        return x + x
'''


def test_a_fast_kernels_clocked_block_runs_in_rounds_and_the_fastest_counts(tmp_path):
    """A busy host only adds to a wall clock: the block the trusted side clocks for a kernel of microseconds
    (a block of well under 50 ms) runs WALL_ROUNDS times, and the fastest round is its external time."""
    from oracle.timing import WALL_ROUNDS
    from tasks.model import Task

    task = Task(id="builtin/tiny", level=None, problem_id=None, name="tiny", code=TINY_TASK, origin="test", sizes={})
    v = _judged_in_plain_torch(task, TINY, TimingParams(warmup_calls=1, min_calls=5, max_calls=10, target_s=0.05,
                                                        wall_calls=10), tmp_path)
    clocked = v.timing["candidate"]
    assert clocked["block_rounds"] == WALL_ROUNDS and 0 < clocked["external_ms"] < 5.0, clocked
    assert clocked["external_drain_ms"] is not None and clocked["wall_drain_ms"] is None  # a CPU: no GPU drain


def test_an_oracle_started_ahead_has_its_workers_before_its_first_candidate(tmp_path):
    """The Ray actor starts its oracle's fork server, reference process and standby workers as it starts, so
    that the first builds and checks do not wait for them; an oracle closed first starts nothing."""
    from multiprocessing import forkserver

    o = Oracle(OracleConfig(device="cpu", cache_dir=tmp_path / "cache", allow_torch=True, timing=FAST, standby_workers=1))
    try:
        assert o.references.process.current is None and o.standby.waiting == 0  # nothing before it is asked
        o.start_ahead().join(120)
        reference = o.references.process.current
        assert reference is not None and reference.process.is_alive()
        assert o.standby.waiting == 1
        assert forkserver._forkserver._forkserver_pid is not None
    finally:
        o.close()
    assert o.references.process.current is None and not reference.process.is_alive()

    closed = Oracle(OracleConfig(device="cpu", cache_dir=tmp_path / "cache", allow_torch=True, timing=FAST, standby_workers=1))
    closed.close()
    closed.start_ahead().join(120)
    assert closed.references.process.current is None and closed.standby.waiting == 0


# A task whose reference takes minutes on a real tensor (fitting runs it on the meta device only).
SLOW_TASK = '''
import time
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        if x.device.type != "meta":
            time.sleep(300)
        return x * 2

def get_inputs():
    return [torch.randn(64)]

def get_init_inputs():
    return []
'''


def test_closing_an_oracle_ends_a_reference_being_made_and_starts_no_other(tmp_path):
    """A run that ends while tasks are still being prepared: closing the oracle ends the reference under way
    and every later request at once, instead of the oracle's process waiting (an hour, once) for them all."""
    import threading

    from tasks.loaders import RawTask, build_task

    slow = build_task(RawTask("builtin/slow", 1, 999, "slow", SLOW_TASK, "slow.py"), 8)
    o = Oracle(OracleConfig(device="cpu", cache_dir=tmp_path / "cache", allow_torch=True, timing=FAST))
    preparing = threading.Thread(target=o.prepare_task, args=(slow,), daemon=True)
    preparing.start()
    deadline = time.monotonic() + 120
    while o.references.process.current is None and time.monotonic() < deadline:
        time.sleep(0.05)
    reference = o.references.process.current
    assert reference is not None
    time.sleep(2)  # well into the request
    began = time.monotonic()
    o.close()
    preparing.join(30)
    assert not preparing.is_alive() and time.monotonic() - began < 30
    assert not reference.process.is_alive() and o.references.process.current is None
    o.prepare_task(slow)  # a task queued behind: nothing starts
    assert o.references.process.current is None
