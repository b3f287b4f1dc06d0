"""Cores kept for timing, apart from the cores the compilers use.

A launch-bound kernel's time is mostly its Python thread issuing launches. When fifteen nvcc builds hold
the sixteen cores, that thread waits for a core between launches and the GPU idles inside the timed
events: a 0.017 ms kernel measured 0.173 ms. A `CorePlan` keeps a core (two on larger machines, each with
its SMT siblings) for the timing workers and confines builds and header makers to the others, the builds
at a lower priority. A `Placement` is what one process gets; it is applied in the process itself before its
work starts (`apply_here`), or to a running process with every thread and child (`apply_to`). Children
inherit both the affinity and the niceness through fork and exec, so ninja, nvcc and cc1plus keep their
build's.

Only lowering priority needs no privilege: a placement never makes a process less nice than it is.

With sched_autogroup (on by default in most Linux distributions) a process that starts a session gets a
new scheduling group at nice 0, and between groups only the group's nice counts: two busy processes in
their own sessions on one core split it evenly, one at nice 0 and one at nice 10. Workers start sessions
of their own, so a placed worker's group gets its nice too (`nice_own_group`, after `setsid`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable


@dataclass(frozen=True)
class Placement:
    """Where a process may run and how nice it is; crosses into a worker as an argument of its start."""

    cores: tuple[int, ...] | None = None  # None: keep the inherited affinity
    nice: int = 0  # at least this nice (never less nice than inherited: raising priority needs privilege)

    def apply_here(self) -> list[str]:
        """Apply to this process, every thread of it included; returns what failed (nothing, normally).
        Meant for a fresh process before its work starts: threads and children made later inherit it."""
        return self._apply_threads(os.getpid())

    def apply_to(self, pid: int) -> list[str]:
        """Apply to a running process, every thread of it, and every process below it. Two passes: a child
        forked between the first scan and its parent's change is found by the second."""
        from oracle.sandbox import _descendants

        failed: list[str] = []
        for _ in range(2):
            for p in [pid, *sorted(_descendants(pid))]:
                failed += self._apply_threads(p)
        return sorted(set(failed))

    def _apply_threads(self, pid: int) -> list[str]:
        failed = self._apply_each_thread(pid)
        try:
            leads_session = os.getsid(pid) == pid
        except OSError:
            leads_session = False
        if leads_session and self.nice > 0:
            failed += nice_own_group(self.nice, pid)
        return failed

    def _apply_each_thread(self, pid: int) -> list[str]:
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            tids = [pid]
        failed: list[str] = []
        for tid in tids:
            failed += self._apply_thread(tid)
        return failed

    def _apply_thread(self, tid: int) -> list[str]:
        """On Linux both the affinity and the nice value belong to a thread, not to its process."""
        failed = []
        if self.cores is not None:
            try:
                os.sched_setaffinity(tid, self.cores)
            except ProcessLookupError:
                return []
            except OSError as exc:
                failed.append(f"affinity of {tid}: {exc.strerror}")
        if self.nice > 0:
            try:
                if os.getpriority(os.PRIO_PROCESS, tid) < self.nice:
                    os.setpriority(os.PRIO_PROCESS, tid, min(19, self.nice))
            except ProcessLookupError:
                return failed
            except OSError as exc:
                failed.append(f"nice of {tid}: {exc.strerror}")
        return failed


def group_nice(pid: int | str = "self") -> int | None:
    """The nice of the scheduling autogroup `pid` is in; None where the kernel keeps no autogroups."""
    try:
        text = Path(f"/proc/{pid}/autogroup").read_text()
    except OSError:
        return None
    parts = text.split()
    return int(parts[-1]) if len(parts) >= 3 and parts[-2] == "nice" else None


def nice_own_group(nice: int, pid: int | str = "self") -> list[str]:
    """Give the autogroup of `pid` (a session leader: its group is its own) at least this nice; returns what
    failed. Nothing to do where the kernel keeps no autogroups."""
    now = group_nice(pid)
    if now is None or now >= nice:
        return []
    try:
        Path(f"/proc/{pid}/autogroup").write_text(str(min(19, nice)))
    except OSError as exc:
        return [f"group nice of {pid}: {exc.strerror}"]
    return []


@dataclass(frozen=True)
class CorePlan:
    """Which cores time and which build. `reserved`: the two sets are apart (not on a 1-core machine)."""

    timing: tuple[int, ...]
    builds: tuple[int, ...]
    build_nice: int = 10

    @property
    def reserved(self) -> bool:
        return not set(self.timing) & set(self.builds)

    @property
    def for_timing(self) -> Placement:
        """For candidate and reference workers: the kept cores, at the inherited priority."""
        return Placement(self.timing, 0)

    @property
    def for_builds(self) -> Placement:
        """For build workers (and all they start): the other cores, less priority. Header makers get only
        the cores (`QuietDevice.header_maker`)."""
        return Placement(self.builds, self.build_nice)

    def describe(self) -> str:
        if not self.reserved:
            return f"no core kept for timing (cores {_ranges(self.builds)}); builds at nice {self.build_nice}"
        return (f"timing on cores {_ranges(self.timing)}, builds on cores {_ranges(self.builds)} at nice "
                f"{self.build_nice}")


def plan_cores(allowed: Iterable[int] | None = None, timing_cores: int | None = None, build_nice: int = 10,
               siblings: Callable[[int], set[int]] | None = None) -> CorePlan:
    """Split the cores this process may use (`os.sched_getaffinity(0)` unless `allowed` is given).

    `timing_cores`: physical cores kept for timing (default: none on 1 core, 1 up to 16, 2 above); the
    highest-numbered ones, with their SMT siblings (`siblings(cpu)`, from sysfs by default), so that no
    compiler shares a physical core with the timing thread. Builds get the rest; when that would leave them
    nothing, the siblings stay with the builds, and with a single core there is no split at all."""
    cores = sorted(set(os.sched_getaffinity(0) if allowed is None else allowed))
    if not cores:
        raise ValueError("no cores to plan")
    want = timing_cores if timing_cores is not None else (0 if len(cores) < 2 else 1 if len(cores) <= 16 else 2)
    siblings = siblings or smt_siblings
    if want <= 0 or len(cores) < 2:
        return CorePlan(tuple(cores), tuple(cores), build_nice)
    want = min(want, len(cores) - 1)
    for with_siblings in (True, False):
        timing: list[int] = []
        left = want
        for cpu in reversed(cores):
            if left <= 0:
                break
            if cpu in timing:
                continue
            group = ({cpu} | siblings(cpu)) & set(cores) if with_siblings else {cpu}
            timing += sorted(group - set(timing))
            left -= 1
        builds = [c for c in cores if c not in timing]
        if builds:
            break
    return CorePlan(tuple(sorted(timing)), tuple(builds), build_nice)


def smt_siblings(cpu: int) -> set[int]:
    """The logical CPUs sharing `cpu`'s physical core (Linux sysfs; just `cpu` where it cannot be read)."""
    try:
        text = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text()
    except OSError:
        return {cpu}
    return _parse_ranges(text) or {cpu}


def _parse_ranges(text: str) -> set[int]:
    found: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        try:
            lo, _, hi = part.partition("-")
            found.update(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            return set()
    return found


def _ranges(cores: Iterable[int]) -> str:
    """0-3,8 style."""
    out, run = [], []
    for c in sorted(cores):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [c]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)
