"""Who else runs while something is timed: the device lock and the processes stopped beside it.

Timing holds the device lock's exclusive side (`oracle.device_lock`) and stops (SIGSTOP) every other
process that could put work on the device meanwhile: the other candidates' workers and the trusted
`torch.compile` worker. On a CPU the device is the cores a compiler uses too, so the builds and the
precompiled-header makers (with every process they started) are stopped as well: a 20-second g++ beside a
2 ms kernel makes its time, and the choice of the fastest kernel, noise. They all resume when the timing
ends; one that starts while a timing holds the device starts stopped.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections import deque
from typing import Iterator

from oracle.cores import Placement
from oracle.device_lock import DeviceLock
from oracle.gpu_lock import TimingLock
from oracle.sandbox import Worker, signal_trees


class QuietDevice:
    def __init__(self, device: str, stop_compilers: bool = True, machine: TimingLock | None = None,
                 build_placement: Placement | None = None, timing_placement: Placement | None = None) -> None:
        # `machine`: the device's machine-wide lock, so that two processes never time on one device at once
        self.lock = DeviceLock(machine)
        self.stop_compilers = device == "cpu" and stop_compilers
        # `build_placement`: where compilers run (oracle.cores: off the cores kept for timing, niced), or None
        self.build_placement = build_placement
        # `timing_placement`: where the process that holds the device alone runs while it times (the cores
        # kept for timing), or None; it gets its own cores back afterwards
        self.timing_placement = timing_placement
        self._workers: set[Worker] = set()  # stopped while another is timed, on every device
        self._builders: set[Worker] = set()  # stopped while anything is timed, on a CPU
        self._header_makers: list[subprocess.Popen] = []
        # a timing holds the device now: a worker (or, on a CPU, a compiler) registered meanwhile starts stopped
        self._held_alone = False
        self._stopped_late: list[int] = []
        self._guard = threading.Lock()

    @contextlib.contextmanager
    def alone(self, own: Worker | None = None, label: str = "timing") -> Iterator[None]:
        """The device to this thread alone: no check runs, every other registered process is stopped, and
        `own` (the process that times) runs on the timing cores while it lasts. `label`: what it is for
        (`DeviceLock.exclusive_by`)."""
        with self.lock.exclusive(label), self._placed_for_timing(own):
            with self._guard:
                others = [w.process.pid for w in self._workers if w is not own]
                if self.stop_compilers:
                    self._header_makers = [m for m in self._header_makers if m.poll() is None]
                    others += [w.process.pid for w in self._builders] + [m.pid for m in self._header_makers]
                self._held_alone = True
                signal_trees(others, signal.SIGSTOP)
            try:
                yield
            finally:
                with self._guard:
                    self._held_alone = False
                    signal_trees(others + self._stopped_late, signal.SIGCONT)
                    self._stopped_late = []

    @contextlib.contextmanager
    def _placed_for_timing(self, own: Worker | None) -> Iterator[None]:
        """The timing thread waits for no core: builds are kept off the timing cores (`build_placement`),
        and the process that times is moved onto them, so the scheduler cannot leave it on a core a build
        holds (a launch-bound kernel's time is its launching thread's)."""
        pid = own.process.pid if own is not None and own.process.pid else None
        if self.timing_placement is None or pid is None:
            yield
            return
        try:
            before = tuple(sorted(os.sched_getaffinity(pid)))
        except OSError:
            yield
            return
        self.timing_placement.apply_to(pid)
        try:
            yield
        finally:
            Placement(before).apply_to(pid)

    @contextlib.contextmanager
    def running(self, worker: Worker) -> Iterator[None]:
        """`worker` may put work on the device: it is stopped while another timing holds the device, also
        when it is registered during one (a standby worker started then would set up the device and the
        profiler beside the timing)."""
        with self._guard:
            self._workers.add(worker)
            if self._held_alone:
                signal_trees([worker.process.pid], signal.SIGSTOP)
                self._stopped_late.append(worker.process.pid)
        try:
            yield
        finally:
            with self._guard:
                self._workers.discard(worker)

    @contextlib.contextmanager
    def building(self, worker: Worker) -> Iterator[None]:
        """A build worker: on a CPU it is stopped while anything is timed."""
        self._register_compiler(worker.process.pid, lambda: self._builders.add(worker))
        try:
            yield
        finally:
            with self._guard:
                self._builders.discard(worker)

    def header_maker(self, maker: subprocess.Popen) -> None:
        """A detached precompiled-header maker: on a CPU it is stopped while anything is timed; it runs on the
        builds' cores but not at their lower priority: it is one process that the later builds wait on. Niced
        like them among fifteen builds on sixteen cores (an H200 run), the header asked for at the oracle's
        start was not ready before the second wave of builds had started without it."""
        if self.build_placement is not None:
            Placement(self.build_placement.cores).apply_to(maker.pid)
        self._register_compiler(maker.pid, lambda: self._header_makers.append(maker))

    def _register_compiler(self, pid: int, add) -> None:
        with self._guard:
            add()
            if self._held_alone and self.stop_compilers:
                signal_trees([pid], signal.SIGSTOP)
                self._stopped_late.append(pid)

    @property
    def idle(self) -> bool:
        """No registered worker is running (every worker was closed and forgotten)."""
        with self._guard:
            return not self._workers and not self._builders


LEND_POLL_S = 0.25  # how often a request waiting for memory looks again at its lender's


class MemoryBudget:
    """Device memory promised to workers: a worker starts when its estimate fits beside the others' (one
    alone always starts), so that checks of a task with GB-sized tensors do not run each other out of memory.

    `in_order`: promises are made in the order they were asked for, so that a large one is not overtaken
    forever by small ones that keep fitting (the torch.compile baselines' timing promise, nearly the whole
    compile share, waited 190 s behind later compile promises on an H100)."""

    def __init__(self, total_bytes: int, in_order: bool = False) -> None:
        self.total = total_bytes
        self.used = 0
        self.in_order = in_order
        self.borrowed = 0  # promised from the lender's memory, now
        self._lender: MemoryBudget | None = None
        self._queue: deque[object] = deque()  # tickets of the waiting requests, first asked first
        self._ahead: set[object] = set()  # the waiting tickets asked `ahead`: at the queue's front
        self._cond = threading.Condition()

    def lend_from(self, lender: MemoryBudget | None) -> None:
        """While `lender` is set, the next request in line that does not fit here is promised from the
        lender's memory instead where it fits there now beside the lender's own promises (which then wait
        for its return). The oracle lends its candidates' share to the torch.compile baselines while no
        candidate is being built: on an H100, 35 of 40 baselines waited 82-142 s for the compile share,
        most of them after the last verdict, with the candidates' share unused."""
        with self._cond:
            self._lender = lender
            self._cond.notify_all()

    @contextlib.contextmanager
    def reserve(self, nbytes: int, ahead: bool = False) -> Iterator[bool]:
        """Hold `nbytes` of the budget's promise; yields whether they were borrowed from the lender.

        `ahead`: in line before every waiting request not so asked (after those that were), for a holder of
        memory that the promise lets go of soon: a compiled torch.compile worker waiting to be timed holds its
        context and kernels, promised nothing, until its timing (a second or so) is done. Asked in order
        behind every level-1 compile promise, the first baseline of an H100 run waited 81 s to be timed."""
        nbytes = min(nbytes, self.total)
        ticket = object()
        lender = None
        with self._cond:
            if ahead:
                self._ahead.add(ticket)
                self._queue.insert(sum(t in self._ahead for t in self._queue), ticket)
            else:
                self._queue.append(ticket)
            try:
                while (self.in_order and self._queue[0] is not ticket) or (self.used and self.used + nbytes > self.total):
                    if self._lender is not None and self._queue[0] is ticket and self._lender.take_if_free(nbytes):
                        lender = self._lender
                        self.borrowed += nbytes
                        break
                    # a lender's memory is freed without a word to this budget: look again every so often
                    self._cond.wait(LEND_POLL_S if self._lender is not None else None)
            finally:
                self._queue.remove(ticket)
                self._ahead.discard(ticket)
                self._cond.notify_all()  # the next in line may fit now
            if lender is None:
                self.used += nbytes
        try:
            yield lender is not None
        finally:
            if lender is not None:
                lender.give_back(nbytes)
            with self._cond:
                if lender is None:
                    self.used -= nbytes
                else:
                    self.borrowed -= nbytes
                self._cond.notify_all()

    def take_if_free(self, nbytes: int) -> bool:
        """Promise `nbytes` at once if they fit beside the promises made and nobody waits; else nothing."""
        with self._cond:
            if self._queue or self.used + nbytes > self.total:
                return False
            self.used += nbytes
            return True

    def give_back(self, nbytes: int) -> None:
        """Return what `take_if_free` promised."""
        with self._cond:
            self.used -= nbytes
            self._cond.notify_all()

    @property
    def waiting(self) -> int:
        """Requests not yet promised their memory."""
        with self._cond:
            return len(self._queue)


class MeasuredPeaks:
    """The most device memory a task's workers were measured to hold (on a GPU, each timed worker says),
    so that its next workers are promised that much: the estimate from the task's sizes misses what a
    kernel allocates for itself and the allocator's rounding (an H200's level-1 workers held 1.5x it)."""

    def __init__(self) -> None:
        self._peaks: dict[str, int] = {}
        self._guard = threading.Lock()

    def promise(self, key: str, estimate: int) -> int:
        with self._guard:
            return max(estimate, self._peaks.get(key, 0))

    def measured(self, key: str, nbytes: int) -> None:
        with self._guard:
            self._peaks[key] = max(self._peaks.get(key, 0), nbytes)
