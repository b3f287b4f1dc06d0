"""Who may use the device while a candidate is timed.

Checking a candidate (import, six calls, comparisons) takes seconds and needs no quiet device; timing it
does. So several candidates may be checked at once (`shared`), while timing (`exclusive`) waits until no
check is running and keeps new ones out until it is done. A waiting timer goes before new checks, so timing
never starves behind a stream of checks.

Given a machine-wide lock (`oracle.gpu_lock.TimingLock`), the same rule holds across processes: a check
also takes the machine lock's shared side and a timing its exclusive side, after this process's own
admission. A timer that waits for another process keeps this process's new checks out meanwhile, so the
other's timing is not disturbed by them either.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from oracle.gpu_lock import TimingLock


class DeviceLock:
    def __init__(self, machine: TimingLock | None = None) -> None:
        self.machine = machine
        self._cond = threading.Condition()
        self._shared = 0  # checks admitted here (some may still wait for the machine lock)
        self._exclusive = False
        self._waiting = 0  # timers waiting for their turn
        self._active = 0  # holders past the machine lock too: what counts as busy
        self._active_since: float | None = None
        self.busy_s = 0.0  # seconds during which anything held the device (shared or exclusive)
        self.exclusive_s = 0.0  # of which timing alone
        self.exclusive_by: dict[str, list[float]] = {}  # what held it alone -> [seconds, times]
        self.machine_wait_s = 0.0  # seconds timers waited for other processes (the machine lock)

    def _enter(self) -> None:
        with self._cond:
            if self._active == 0:
                self._active_since = time.perf_counter()
            self._active += 1

    def _leave(self) -> None:
        with self._cond:
            self._active -= 1
            if self._active == 0 and self._active_since is not None:
                self.busy_s += time.perf_counter() - self._active_since
                self._active_since = None

    def _machine(self, exclusive: bool) -> contextlib.AbstractContextManager:
        if self.machine is None:
            return contextlib.nullcontext()
        return self.machine.held() if exclusive else self.machine.checking()

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._exclusive or self._waiting:
                self._cond.wait()
            self._shared += 1
        try:
            with self._machine(exclusive=False):
                self._enter()
                try:
                    yield
                finally:
                    self._leave()
        finally:
            with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self, label: str = "timing") -> Iterator[None]:
        """`label`: what holds the device alone (a candidate's timing, a baseline), for `exclusive_by`."""
        with self._cond:
            self._waiting += 1
            while self._exclusive or self._shared:
                self._cond.wait()
            self._waiting -= 1
            self._exclusive = True
        try:
            with self._machine(exclusive=True) as hold:
                if hold is not None:
                    self.machine_wait_s += hold.waited_s
                self._enter()
                started = time.perf_counter()
                try:
                    yield
                finally:
                    held = time.perf_counter() - started
                    self.exclusive_s += held
                    with self._cond:  # `exclusive_by_now` copies it from another thread
                        spent = self.exclusive_by.setdefault(label, [0.0, 0])
                        spent[0] += held
                        spent[1] += 1
                    self._leave()
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()

    def exclusive_by_now(self) -> dict[str, tuple[float, int]]:
        """A copy of `exclusive_by`: seconds held alone and times, by what held it."""
        with self._cond:
            return {k: (v[0], int(v[1])) for k, v in self.exclusive_by.items()}

    def busy_now(self) -> float:
        """busy_s including the current stretch."""
        with self._cond:
            extra = time.perf_counter() - self._active_since if self._active_since is not None else 0.0
            return self.busy_s + extra
