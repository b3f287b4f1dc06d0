"""One timing at a time per GPU, across every kernelsearch process on the machine.

`DeviceLock` keeps one process's checks and timings apart. Two processes on one GPU (two runs, or an `eval`
beside a `run`) would still time at once, and each would count the other's kernels in its events: four
evals started together measured a 5.2 ms eager GEMM that takes 2.7 ms alone. This lock extends the same
rule to the whole machine, through a lock file per GPU (keyed by its UUID) in the cache folder:

- `checking()`, the shared side: checks of any number of processes may overlap each other;
- `held()`, the exclusive side: a timing waits until no process checks or times on that GPU, and while it
  waits no new check of any process starts (a waiting timer goes first, so timing never starves).

It is `flock` on two files: `<key>.lock` (shared for checks, exclusive for timing) and `<key>.queue`, a
turnstile that a timer holds while it waits and that every new check passes through. A process that dies,
however it dies, releases what it held. Within one process the lock is shared by all threads (one object
per lock file, from `timing_lock`): a thread's nested holds are counted, not taken twice.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

CPU_KEY = "cpu"


class TimingLockBusy(Exception):
    """`wait=False` and another holder is in the way."""


@dataclass
class Hold:
    """One admission: how long the caller waited for it (seconds), 0 for a nested one."""

    waited_s: float = 0.0
    nested: bool = False


def gpu_key(device: str, index: int = 0) -> str:
    """The lock key of a device: "cpu" on a CPU, else the UUID of the `index`-th visible GPU (as CUDA numbers
    them under CUDA_VISIBLE_DEVICES). Read from CUDA_VISIBLE_DEVICES when it names UUIDs, else from nvidia-smi,
    else from torch (which initialises CUDA in this process, so it comes last); "cuda<N>" when all fail."""
    if device != "cuda":
        return CPU_KEY
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    physical = str(index)
    if "CUDA_VISIBLE_DEVICES" in os.environ and index < len(visible):
        if visible[index].startswith(("GPU-", "MIG-")):
            return _safe(visible[index])
        physical = visible[index]
    try:
        out = subprocess.run(["nvidia-smi", f"--id={physical}", "--query-gpu=uuid", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout.strip()
        if out:
            return _safe(out.splitlines()[0])
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        import torch

        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
        if uuid is not None:
            return _safe(f"GPU-{uuid}")
    except Exception:  # noqa: BLE001 - no driver, no device: fall through to the index
        pass
    return f"cuda{index}"


def _safe(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", key.strip())


def lock_root(cache_dir: Path | None = None) -> Path:
    """Where the lock files live: `locks/` in the cache folder (`cache_dir`, else $KERNELSEARCH_CACHE, else
    ~/.cache/kernelsearch), so every process sharing a build cache shares the locks too."""
    from oracle.build import cache_root

    return cache_root(cache_dir).parent / "locks"


_instances: dict[Path, "TimingLock"] = {}
_instances_lock = threading.Lock()


def timing_lock(key: str, root: Path) -> "TimingLock":
    """The one `TimingLock` of this process for `key` under `root` (two objects on one file would exclude
    each other inside the process, and a thread's nested hold would wait for itself)."""
    path = (Path(root) / f"gpu-{_safe(key)}.lock").resolve()
    with _instances_lock:
        if path not in _instances:
            _instances[path] = TimingLock(key, root)
        return _instances[path]


def for_device(device: str, cache_dir: Path | None = None, index: int = 0) -> "TimingLock":
    """The machine-wide timing lock of this oracle's device: the one call an oracle needs."""
    return timing_lock(gpu_key(device, index), lock_root(cache_dir))


class TimingLock:
    """The lock of one GPU; use `timing_lock` or `for_device` to get the process's instance."""

    def __init__(self, key: str, root: Path) -> None:
        self.key = key
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        self.path = root / f"gpu-{_safe(key)}.lock"
        self.queue_path = root / f"gpu-{_safe(key)}.queue"
        self._cond = threading.Condition()
        self._owner: int | None = None  # thread that holds (or is taking) the exclusive side
        self._depth = 0  # its nested holds
        self._waiting = 0  # threads of this process waiting for the exclusive side
        self._shared = 0  # checks of this process admitted; the shared flock is held while > 0
        self._shared_fd: int | None = None
        self._taking_shared = False  # one thread is taking the shared flock for the process
        self._local = threading.local()  # per thread: its depth on the shared side
        self.waited_s = 0.0  # all waits for the exclusive side, summed
        self.holds = 0  # exclusive admissions (not nested)

    # ------------------------------------------------------------ the exclusive side: timing

    @contextlib.contextmanager
    def held(self, wait: bool = True) -> Iterator[Hold]:
        """Hold the GPU alone, machine-wide. `wait=False`: raise TimingLockBusy instead of waiting."""
        me = threading.get_ident()
        with self._cond:
            nested = self._owner == me
            if nested:
                self._depth += 1
        if nested:
            try:
                yield Hold(0.0, nested=True)
            finally:
                with self._cond:
                    self._depth -= 1
            return
        if getattr(self._local, "shared", 0):
            raise RuntimeError("a thread that is checking cannot start a timing (it would wait for itself)")
        started = time.monotonic()
        with self._cond:
            self._waiting += 1
            try:
                while self._owner is not None or self._shared or self._taking_shared:
                    if not wait:
                        raise TimingLockBusy(f"{self.key}: held by this process")
                    self._cond.wait()
            finally:
                self._waiting -= 1
            self._owner, self._depth = me, 1
        try:
            fd = self._take_exclusive(wait)
        except BaseException:
            with self._cond:
                self._owner, self._depth = None, 0
                self._cond.notify_all()
            raise
        waited = time.monotonic() - started
        with self._cond:
            self.waited_s += waited
            self.holds += 1
        try:
            yield Hold(waited)
        finally:
            _unlock(fd)
            with self._cond:
                self._owner, self._depth = None, 0
                self._cond.notify_all()

    def _take_exclusive(self, wait: bool) -> int:
        """Through the turnstile (held while waiting: new checks of every process queue behind it), then the
        lock file itself, exclusively. Records this process as the holder."""
        queue = self._lock(self.queue_path, fcntl.LOCK_EX, wait)
        try:
            fd = self._lock(self.path, fcntl.LOCK_EX, wait)
        finally:
            _unlock(queue)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass  # the holder's pid is a courtesy for messages, not part of the lock
        return fd

    # ------------------------------------------------------------ the shared side: checks

    @contextlib.contextmanager
    def checking(self, wait: bool = True) -> Iterator[Hold]:
        """Check beside other checks, of this process or another, but not beside a timing on this GPU.
        `wait=False`: raise TimingLockBusy instead of waiting."""
        me = threading.get_ident()
        depth = getattr(self._local, "shared", 0)
        with self._cond:
            nested = depth > 0 or self._owner == me  # inside a timing, a check is part of it
        if nested:
            self._local.shared = depth + 1
            try:
                yield Hold(0.0, nested=True)
            finally:
                self._local.shared -= 1
            return
        started = time.monotonic()
        self._admit_shared(wait)
        self._local.shared = 1
        try:
            yield Hold(time.monotonic() - started)
        finally:
            self._local.shared = 0
            with self._cond:
                self._shared -= 1
                if self._shared == 0 and self._shared_fd is not None:
                    _unlock(self._shared_fd)
                    self._shared_fd = None
                self._cond.notify_all()

    def _admit_shared(self, wait: bool) -> None:
        while True:
            with self._cond:  # a timer of this process goes first
                while self._owner is not None or self._waiting:
                    if not wait:
                        raise TimingLockBusy(f"{self.key}: timed by this process")
                    self._cond.wait()
            # Every new check passes the turnstile, even when this process already holds the shared lock:
            # a timer of another process waiting there goes first, and this thread, not yet counted, does
            # not keep it waiting.
            _unlock(self._lock(self.queue_path, fcntl.LOCK_EX, wait))
            with self._cond:
                if self._owner is not None or self._waiting:
                    continue  # a timer of this process came meanwhile: after it, through the turnstile again
                if self._shared:
                    self._shared += 1
                    return
                if self._taking_shared:  # another thread is taking the shared lock for the process: after it
                    if not wait:
                        raise TimingLockBusy(f"{self.key}: being taken for a check by another thread")
                    self._cond.wait()
                    continue
                self._taking_shared = True
            try:
                fd = self._lock(self.path, fcntl.LOCK_SH, wait)
            except BaseException:
                with self._cond:
                    self._taking_shared = False
                    self._cond.notify_all()
                raise
            with self._cond:
                self._taking_shared = False
                self._shared_fd, self._shared = fd, 1
                self._cond.notify_all()
            return

    # ------------------------------------------------------------ helpers

    def _lock(self, path: Path, kind: int, wait: bool) -> int:
        """A new open file description of `path`, locked (each its own: flock is per description)."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, kind if wait else kind | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise TimingLockBusy(f"{self.key}: {'timed' if kind == fcntl.LOCK_SH else 'checked or timed'} by "
                                 f"another process{_pid_note(self.holder())}") from None
        except BaseException:
            os.close(fd)
            raise
        return fd

    def holder(self) -> int | None:
        """The pid of the process that timed on this GPU last, if it is still alive (it may be done by now):
        for a message that says whom a timing waits for."""
        try:
            pid = int(self.path.read_text().strip() or 0)
        except (OSError, ValueError):
            return None
        return pid if pid > 0 and Path(f"/proc/{pid}").exists() else None


def _pid_note(pid: int | None) -> str:
    return f" (the last to time on it: pid {pid})" if pid else ""


def _unlock(fd: int) -> None:
    """Unlock before closing: a copy of the descriptor in a forked child would otherwise keep it locked."""
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
