"""Candidate workers started ahead of their candidates.

A candidate's worker is a fresh process, and before its first check it pays for starting one: Python and
torch imported, the device set up, and the first use of the profiled call's machinery (a dispatch mode's
first call, the CUDA profiler's first start). A
`StandbyWorkers` keeps a few workers started that have done all that and wait, with no job, for their
candidate (`oracle.harness.candidate_entry` on standby). A candidate takes one, gets its job and files,
and a fresh one starts behind it. Each worker still judges one candidate only and is never reused; nothing
of a candidate is in it before it is taken.

Standby workers are registered with the device's quiet-keeper, so a timing stops them (their warm-up is
CPU work that would otherwise share the cores with the timing thread).
"""

from __future__ import annotations

import contextlib
import json
import threading
from typing import Any, Callable, ContextManager

from oracle.harness import STANDBY_FILE, candidate_entry
from oracle.sandbox import Worker


class StandbyWorkers:
    def __init__(self, device: str, size: int, register: Callable[[Worker], ContextManager]) -> None:
        """`size` workers kept ready for `device`; `register(worker)`: held while one waits (QuietDevice.running)."""
        self.device = device
        self.size = max(0, size)
        self._register = register
        self._ready: list[tuple[Worker, contextlib.ExitStack]] = []
        self._guard = threading.Lock()
        self._closed = False

    def take(self, job: dict[str, Any], files: dict[str, str], env: dict[str, str] | None = None) -> Worker:
        """A worker with `job` and `files`: a ready one when there is one alive (and no special `env`), else
        one started now; either way the pool is filled again behind it."""
        worker = self._ready_one() if env is None else None
        if worker is not None:
            try:
                worker.assign(job, files)
            except OSError:  # its set-up failed and it closed its end of the pipe: start one the ordinary way
                worker.close()
                worker = None
        if worker is None:
            worker = Worker(candidate_entry, job, files, env=env)
        self.fill()
        return worker

    def _ready_one(self) -> Worker | None:
        while True:
            with self._guard:
                if not self._ready:
                    return None
                worker, registration = self._ready.pop(0)
            registration.close()
            if worker.process.is_alive():
                return worker
            worker.close()  # its setup failed, or it was killed: the next one, or a fresh start

    def fill(self) -> None:
        """Start workers until `size` wait."""
        while True:
            with self._guard:
                if self._closed or len(self._ready) >= self.size:
                    return
                worker = Worker(candidate_entry, None, {STANDBY_FILE: json.dumps({"device": self.device})})
                registration = contextlib.ExitStack()
                registration.enter_context(self._register(worker))
                self._ready.append((worker, registration))

    @property
    def waiting(self) -> int:
        with self._guard:
            return len(self._ready)

    def close(self) -> None:
        with self._guard:
            self._closed = True
            ready, self._ready = self._ready, []
        for worker, registration in ready:
            registration.close()
            worker.close()
