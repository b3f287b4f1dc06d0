"""Who may use the device while a candidate is timed.

Checking a candidate (import, six calls, comparisons) takes seconds and needs no quiet device; timing it
does. So several candidates may be checked at once (`shared`), while timing (`exclusive`) waits until no
check is running and keeps new ones out until it is done. A waiting timer goes before new checks, so timing
never starves behind a stream of checks.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator


class DeviceLock:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting = 0  # timers waiting for their turn
        self._active_since: float | None = None
        self.busy_s = 0.0  # seconds during which anything held the device (shared or exclusive)
        self.exclusive_s = 0.0  # of which timing alone

    def _enter(self) -> None:
        if self._shared == 0 and not self._exclusive:
            self._active_since = time.perf_counter()

    def _leave(self) -> None:
        if self._shared == 0 and not self._exclusive and self._active_since is not None:
            self.busy_s += time.perf_counter() - self._active_since
            self._active_since = None

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._exclusive or self._waiting:
                self._cond.wait()
            self._enter()
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                self._leave()
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._waiting += 1
            while self._exclusive or self._shared:
                self._cond.wait()
            self._waiting -= 1
            self._enter()
            self._exclusive = True
        started = time.perf_counter()
        try:
            yield
        finally:
            with self._cond:
                self.exclusive_s += time.perf_counter() - started
                self._exclusive = False
                self._leave()
                self._cond.notify_all()

    def busy_now(self) -> float:
        """busy_s including the current stretch."""
        with self._cond:
            extra = time.perf_counter() - self._active_since if self._active_since is not None else 0.0
            return self.busy_s + extra
