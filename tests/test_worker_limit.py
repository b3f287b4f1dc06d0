"""The torch.compile workers' limit (oracle.reference.WorkerLimit): it may grow while a worker waits for it."""

from __future__ import annotations

import threading

from oracle.reference import References, ReferenceSettings, WorkerLimit
from oracle.timing import TimingParams


def _waiting_acquire(limit: WorkerLimit) -> tuple[threading.Thread, threading.Event]:
    got = threading.Event()

    def take() -> None:
        limit.acquire()
        got.set()

    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    return thread, got


def test_a_waiting_worker_goes_when_the_limit_grows_and_a_lower_limit_waits_for_releases():
    limit = WorkerLimit(1)
    limit.acquire()
    thread, got = _waiting_acquire(limit)
    assert not got.wait(0.2)  # one at a time
    limit.set_limit(2)
    assert got.wait(10) and limit.held == 2
    thread.join(10)
    limit.set_limit(1)  # narrower again: a third waits until both running ones have finished
    third, got3 = _waiting_acquire(limit)
    limit.release()
    assert not got3.wait(0.2)  # still one held: at the limit
    limit.release()
    assert got3.wait(10) and limit.held == 1
    third.join(10)


def test_the_references_widen_their_compile_workers_while_the_cores_are_idle(tmp_path):
    settings = ReferenceSettings(device="cpu", device_name="cpu", threads=1, check_seeds=(1,), extra_size_seed=2,
                                 timing_seeds=(3,), init_seed=0, timing=TimingParams(), wants_compile=True,
                                 call_timeout_s=60, time_timeout_s=60, compile_timeout_s=60, budget_bytes=1 << 30,
                                 compile_workers=2, compile_workers_idle=6)
    refs = References(settings, tmp_path / "baselines", alone=None, shared=None, register=None)
    try:
        assert refs._compiles.limit == 2
        refs.cores_idle(True)
        assert refs._compiles.limit == 6
        refs.cores_idle(False)
        assert refs._compiles.limit == 2
    finally:
        refs.close()
