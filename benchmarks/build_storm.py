"""Cold builds beside a timing, for benchmarks/fidelity.py: `Storm` keeps `n` builds running through an
oracle, and handles them one of three ways while that oracle times (its `check_and_time(quiet=...)`)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path
from typing import Iterator

from oracle import Oracle
from oracle.candidate import Candidate
from oracle.cores import plan_cores
from oracle.sandbox import _descendants, signal_trees
from tasks.model import Task

COMPILERS = {"cc1plus", "cicc", "cudafe++", "ptxas", "nvcc", "gcc", "g++", "c++"}


class Storm:
    """`n` cold builds at once through the oracle, each of a candidate source no cache has seen, started
    again as each ends, until stopped. `handling`: what is done about them while kernelsearch times:
    `asis`, whatever the oracle itself does; `stop`, they are stopped (SIGSTOP, with all they started)
    for every timing; `reserve`, they are confined to the cores `oracle.cores.plan_cores()` leaves to
    builds, at its lower priority, and the candidate workers are put on its timing cores for the timing;
    `unplaced`, as the oracle does, except that the process that times stays where it was instead of
    moving onto the kept timing cores (the oracle's `timing_placement` off for the pass)."""

    def __init__(self, oracle: Oracle, task: Task, source: str, n: int, handling: str = "asis") -> None:
        self.oracle, self.task, self.source, self.n, self.handling = oracle, task, source, n, handling
        self.plan = plan_cores() if handling == "reserve" else None
        self._placement = oracle.quiet.timing_placement
        if handling == "unplaced":
            oracle.quiet.timing_placement = None
        self.stopping = threading.Event()
        self.paused = threading.Event()  # `stop`: no build starts while a timing runs
        self.threads = [threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(n)]
        if self.plan is not None:
            self.threads.append(threading.Thread(target=self._confine, daemon=True))
        self.completed = 0  # builds that ran to the end (the throughput)
        self.pinned: set[int] = set()  # `reserve`: workers put on the timing cores
        self.started_at = self.stopped_at = 0.0

    def _loop(self, i: int) -> None:
        k = 0
        while not self.stopping.is_set():
            if self.paused.is_set():
                time.sleep(0.02)
                continue
            nonce = f"// storm {i} {k} {time.time()}"
            text = self.source.replace("#include <torch/extension.h>", f"#include <torch/extension.h>\n{nonce}", 1)
            candidate = self.oracle.extract(self.task, text)
            if isinstance(candidate, Candidate):
                outcome = self.oracle.build(candidate)
                self.completed += bool(outcome.ok and not self.stopping.is_set())
            k += 1

    def _confine(self) -> None:
        """`reserve`: each build worker and header maker, once, with what runs below it by then; what it
        starts later inherits the placement."""
        done: set[int] = set()
        while not self.stopping.is_set():
            with self.oracle.quiet._guard:
                pids = [w.process.pid for w in self.oracle.quiet._builders] + [m.pid for m in self.oracle.quiet._header_makers]
            for pid in pids:
                if pid and pid not in done:
                    self.plan.for_builds.apply_to(pid)
                    done.add(pid)
            time.sleep(0.05)

    def _compiler_pids(self) -> list[int]:
        with self.oracle.quiet._guard:
            return ([w.process.pid for w in self.oracle.quiet._builders]
                    + [m.pid for m in self.oracle.quiet._header_makers if m.poll() is None])

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """Held by the oracle while it times (`check_and_time`'s `quiet`)."""
        if self.handling == "reserve":
            with self._while_timing(self._pin_timing_workers):
                yield
            return
        if self.handling != "stop":
            yield
            return
        self.paused.set()
        stopped: set[int] = set()

        def stop_new() -> None:  # a build that was starting as the timing began is stopped as it appears
            new = [p for p in self._compiler_pids() if p not in stopped]
            signal_trees(new, signal.SIGSTOP)
            stopped.update(new)

        try:
            with self._while_timing(stop_new):
                yield
        finally:
            signal_trees(sorted(stopped), signal.SIGCONT)
            self.paused.clear()

    @contextlib.contextmanager
    def _while_timing(self, step) -> Iterator[None]:
        """Run `step` now and every 20 ms until the timing ends."""
        done = threading.Event()

        def loop() -> None:
            while not done.wait(0.02):
                step()

        step()
        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()

    def _pin_timing_workers(self) -> None:
        """`reserve`: every worker that is not a build (the candidate being timed, or the reference worker
        timing a baseline) on the timing cores, once each."""
        from multiprocessing import forkserver

        server = getattr(forkserver._forkserver, "_forkserver_pid", None)
        if not server:
            return
        builders = set(self._compiler_pids())
        for pid in _children(server):
            if pid not in builders and pid not in self.pinned:
                self.plan.for_timing.apply_to(pid)
                self.pinned.add(pid)

    def start(self, wait_s: float = 180) -> int:
        self.started_at = time.monotonic()
        for t in self.threads:
            t.start()
        deadline = time.monotonic() + wait_s
        while compilers_running(self.oracle) < self.n and time.monotonic() < deadline:
            time.sleep(0.2)
        return compilers_running(self.oracle)

    def stop(self) -> None:
        """Stop starting builds and kill the ones running (their results are not wanted)."""
        self.stopping.set()
        self.stopped_at = time.monotonic()
        self.oracle.quiet.timing_placement = self._placement
        for _ in range(50):
            for worker in list(self.oracle.quiet._builders):
                worker.close()
            if not any(t.is_alive() for t in self.threads):
                break
            time.sleep(0.2)

    def throughput(self) -> str:
        minutes = max(1e-9, (self.stopped_at - self.started_at) / 60)
        return (f"{self.completed} storm builds completed in {60 * minutes:.0f} s: {self.completed / minutes:.1f} "
                f"a minute")


def _children(pid: int) -> list[int]:
    """The direct children of `pid` (Linux)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:  # a kernel without that file: by the parent in each process's stat
        found = []
        for entry in os.listdir("/proc"):
            try:
                if entry.isdigit() and int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
        return found


@contextlib.contextmanager
def compilers_stopped(oracle: Oracle) -> Iterator[None]:
    """A quiet machine for a while: the header makers the builds asked for (detached, a minute each) and any
    build still running are stopped, and resumed afterwards."""
    with oracle.quiet._guard:
        pids = [w.process.pid for w in oracle.quiet._builders] + [m.pid for m in oracle.quiet._header_makers if m.poll() is None]
    signal_trees(pids, signal.SIGSTOP)
    try:
        yield
    finally:
        signal_trees(pids, signal.SIGCONT)


def compilers_running(oracle: Oracle) -> int:
    found = 0
    for worker in list(oracle.quiet._builders):
        for pid in _descendants(worker.process.pid):
            try:
                found += Path(f"/proc/{pid}/comm").read_text().strip() in COMPILERS
            except OSError:
                pass
    return found
