"""One timing at a time per GPU across processes (oracle/gpu_lock.py) and its use by DeviceLock.

The processes are real (multiprocessing spawn). No test relies on timing: a process that must wait is seen
waiting inside flock, in /proc/locks, before the holder lets go."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import pytest

import lock_holders
from oracle.device_lock import DeviceLock
from oracle.gpu_lock import CPU_KEY, TimingLockBusy, for_device, gpu_key, lock_root, timing_lock

pytestmark = pytest.mark.skipif(not Path("/proc/locks").exists(), reason="needs Linux's /proc/locks")
KEY = "GPU-00000000-test"
CTX = multiprocessing.get_context("spawn")


def _start(fn, *args) -> multiprocessing.Process:
    p = CTX.Process(target=fn, args=tuple(str(a) for a in args), daemon=True)
    p.start()
    return p


def _wait_for(path: Path, *procs: multiprocessing.Process) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert all(p.is_alive() for p in procs), f"a helper process died before writing {path.name}"
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.01)


def _blocked_in_flock(pid: int, path: Path) -> bool:
    """Whether process `pid` is waiting for a flock on `path` (a `->` line of /proc/locks)."""
    inode = os.stat(path).st_ino
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" not in fields:
            continue
        fields.remove("->")
        try:
            if int(fields[4]) == pid and int(fields[5].rsplit(":", 1)[1]) == inode:
                return True
        except (IndexError, ValueError):
            continue
    return False


def _until_blocked(proc: multiprocessing.Process, path: Path, must_not_appear: Path) -> None:
    """Wait until `proc` waits inside flock on `path`; fail at once if it got in instead."""
    deadline = time.monotonic() + 60
    while not (path.exists() and _blocked_in_flock(proc.pid, path)):
        assert not must_not_appear.exists(), f"{must_not_appear.stem} got in while it should have waited"
        assert proc.is_alive() and time.monotonic() < deadline, "the second process never came to wait"
        time.sleep(0.01)


def _probe(root: Path, folder: Path, side: str, name: str, key: str = KEY) -> str:
    p = _start(lock_holders.probe, root, key, side, folder, name)
    p.join(60)
    return json.loads((folder / f"{name}.json").read_text())


def _lock_file(root: Path, key: str = KEY) -> Path:
    return root / f"gpu-{key}.lock"


def test_two_processes_never_time_on_one_gpu_at_once(tmp_path):
    root = tmp_path / "locks"
    a = _start(lock_holders.hold_until, root, KEY, "timing", tmp_path, "a")
    _wait_for(tmp_path / "a.in", a)
    b = _start(lock_holders.hold_until, root, KEY, "timing", tmp_path, "b")
    _until_blocked(b, _lock_file(root), must_not_appear=tmp_path / "b.in")
    (tmp_path / "a.release").touch()
    _wait_for(tmp_path / "b.in", b)
    (tmp_path / "b.release").touch()
    for p in (a, b):
        p.join(60)
    a_in, a_out, b_in, b_out = (float((tmp_path / n).read_text()) for n in ("a.in", "a.out", "b.in", "b.out"))
    assert a_in < a_out <= b_in < b_out  # the two holds, by the machine's monotonic clock, do not overlap
    waited = float((tmp_path / "b.waited").read_text())
    assert 0 < waited <= b_in - float((tmp_path / "b.trying").read_text())


def test_a_holder_that_dies_releases_the_gpu(tmp_path):
    root = tmp_path / "locks"
    a = _start(lock_holders.hold_until, root, KEY, "timing", tmp_path, "a")
    _wait_for(tmp_path / "a.in", a)
    lock = timing_lock(KEY, root)
    with pytest.raises(TimingLockBusy, match=f"pid {a.pid}"):
        with lock.held(wait=False):
            pass
    os.kill(a.pid, signal.SIGKILL)
    a.join(60)
    with lock.held(wait=False) as hold:
        assert not hold.nested
    assert lock.holder() == os.getpid()


def test_different_gpus_do_not_block_each_other(tmp_path):
    root = tmp_path / "locks"
    a = _start(lock_holders.hold_until, root, KEY, "timing", tmp_path, "a")
    _wait_for(tmp_path / "a.in", a)
    try:
        assert _probe(root, tmp_path, "timing", "same") == "busy"
        assert _probe(root, tmp_path, "timing", "other", key="GPU-11111111-other") == "free"
    finally:
        (tmp_path / "a.release").touch()
        a.join(60)


def test_checks_of_two_processes_overlap_but_not_with_a_timing(tmp_path):
    root = tmp_path / "locks"
    a = _start(lock_holders.hold_until, root, KEY, "checking", tmp_path, "a")
    _wait_for(tmp_path / "a.in", a)
    try:
        assert _probe(root, tmp_path, "checking", "check") == "free"
        assert _probe(root, tmp_path, "timing", "time") == "busy"
    finally:
        (tmp_path / "a.release").touch()
        a.join(60)
    assert _probe(root, tmp_path, "timing", "after") == "free"


def test_a_timer_waiting_for_checks_keeps_new_checks_of_every_process_out(tmp_path):
    """A checks; B wants to time and waits for A; a new check (here) must now wait for B, not slip in."""
    root = tmp_path / "locks"
    lock = timing_lock(KEY, root)
    a = _start(lock_holders.hold_until, root, KEY, "checking", tmp_path, "a")
    _wait_for(tmp_path / "a.in", a)
    b = _start(lock_holders.hold_until, root, KEY, "timing", tmp_path, "b")
    try:
        _until_blocked(b, _lock_file(root), must_not_appear=tmp_path / "b.in")
        with pytest.raises(TimingLockBusy):
            with lock.checking(wait=False):
                pass
        (tmp_path / "a.release").touch()
        _wait_for(tmp_path / "b.in", b)
        with pytest.raises(TimingLockBusy):
            with lock.checking(wait=False):
                pass
    finally:
        (tmp_path / "a.release").touch()
        (tmp_path / "b.release").touch()
        a.join(60)
        b.join(60)
    with lock.checking(wait=False):
        pass


def test_threads_of_one_process_take_turns_and_nest(tmp_path):
    lock = timing_lock(KEY, tmp_path / "locks")
    inside, release = threading.Event(), threading.Event()
    nested: list[bool] = []

    def timer() -> None:
        with lock.held():
            inside.set()
            release.wait(60)
            with lock.held(wait=False) as again:  # the other thread's refused tries left its hold intact
                nested.append(again.nested)

    t = threading.Thread(target=timer)
    t.start()
    try:
        assert inside.wait(60)
        for side in (lock.held, lock.checking):
            with pytest.raises(TimingLockBusy):
                with side(wait=False):
                    pass
    finally:
        release.set()
        t.join(60)
    assert nested == [True]
    with lock.held() as outer:
        with lock.held(wait=False) as inner, lock.checking(wait=False) as check:
            assert inner.nested and check.nested and not outer.nested
    with lock.checking():
        with lock.checking(wait=False) as again:
            assert again.nested
        with pytest.raises(RuntimeError):
            with lock.held():
                pass
    assert lock.holds == 2


def test_device_lock_takes_the_machine_lock_for_checks_and_timing(tmp_path):
    root = tmp_path / "locks"
    device_lock = DeviceLock(machine=timing_lock(KEY, root))
    with device_lock.exclusive():
        assert _probe(root, tmp_path, "checking", "x_check") == "busy"
        assert _probe(root, tmp_path, "timing", "x_time") == "busy"
    with device_lock.shared():
        assert _probe(root, tmp_path, "checking", "s_check") == "free"
        assert _probe(root, tmp_path, "timing", "s_time") == "busy"
    assert _probe(root, tmp_path, "timing", "after") == "free"
    assert device_lock.busy_s > 0 and device_lock.exclusive_s > 0


def test_keys_and_where_the_locks_live(tmp_path, monkeypatch):
    assert gpu_key("cpu") == CPU_KEY
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaaa-1111,GPU-bbbb-2222")
    assert gpu_key("cuda", 1) == "GPU-bbbb-2222"
    assert lock_root(tmp_path) == tmp_path / "locks"
    assert for_device("cpu", tmp_path) is for_device("cpu", tmp_path)
    assert for_device("cpu", tmp_path).path == tmp_path / "locks" / "gpu-cpu.lock"


def test_the_oracle_times_under_its_devices_machine_lock(tmp_path):
    """An oracle's device lock takes the machine-wide lock of its device (here the CPU's), in its cache folder."""
    from oracle import Oracle, OracleConfig

    oracle = Oracle(OracleConfig(device="cpu", cache_dir=tmp_path))
    machine = oracle.quiet.lock.machine
    assert machine is not None and machine.key == "cpu" and machine.path.parent == tmp_path / "locks"
    with oracle.alone():
        assert machine.holder() == os.getpid()
