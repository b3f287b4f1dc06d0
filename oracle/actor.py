"""The Ray oracle actor: one per GPU (or a CPU oracle), with CPU build slots and one timing slot.

Builds run in worker processes with the GPU hidden, several at a time, while the one timing slot checks
and times a candidate on the device: the GPU does not wait while builds are queued. Untrusted code never
runs in this actor itself, only in the workers it starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ray

from oracle.candidate import Candidate
from oracle.device_slots import DeviceSlots
from oracle.evaluate import Oracle, OracleConfig, not_measured
from oracle.occupancy import Occupancy
from oracle.verdict import Verdict
from tasks.model import Task


@ray.remote(max_restarts=-1, max_task_retries=0)
class OracleActor:
    def __init__(self, config: OracleConfig, build_slots: int, gate: Any = None, gate_key: str | None = None) -> None:
        faulthandler.register(signal.SIGUSR1, all_threads=True, chain=True)  # kill -USR1: the threads' stacks, to its log
        t0 = time.perf_counter()
        self.oracle = Oracle(config)
        self.oracle.start_ahead()  # its workers' fork server, reference process and standby workers
        self.init_s = {"oracle": round(time.perf_counter() - t0, 3), **self.oracle.init_s}
        self.gate, self.gate_key = gate, gate_key  # optional: pause generation on a shared GPU while timing
        self.holder = ray.get_runtime_context().get_actor_id()
        if gate is not None:  # restarted after dying mid-timing: drop the pause the dead one held
            gate.forget.remote(self.holder)
        self.build_slots = asyncio.Semaphore(build_slots)
        # candidates on the device at once: their checks overlap, their timing does not (oracle.device_lock);
        # re-timings wait while the oracle has candidates (oracle.device_slots)
        self.device_slots = DeviceSlots(config.device_slots)
        # candidates from their arrival to the end of their build: while none is, the build cores are free
        # and more torch.compile baselines are made at once
        self.building = Occupancy(self.oracle.builds_idle)
        self.busy = {"building": 0, "timing": 0, "queued": 0}
        self._preparing: dict[str, asyncio.Future] = {}  # per task code: its reference made beside the first build
        # threads of their own: waiting for the reference process or the device, they would otherwise take
        # the default executor's threads from the builds and checks
        self._prepare_threads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="prepare")
        self.build_s = 0.0
        self.started = time.time()
        self.first_evaluate_at: float | None = None  # when the first candidate came (`stats`)

    async def evaluate(self, task_json: dict[str, Any], candidate_json: dict[str, Any]) -> dict[str, Any]:
        """Build (a CPU slot), then check and time (the device slot); the verdict as JSON."""
        if self.first_evaluate_at is None:
            self.first_evaluate_at = time.time()
        task = Task.from_json(task_json)
        candidate = Candidate(**candidate_json)
        self._prepare(task)
        async with self.device_slots.candidate():  # from here to its verdict, re-timings wait
            with self.building.held():
                self.busy["queued"] += 1
                asked = time.perf_counter()
                async with self.build_slots:
                    queued = {"build": round(time.perf_counter() - asked, 4)}
                    self.busy["queued"] -= 1
                    self.busy["building"] += 1
                    t0 = time.perf_counter()
                    try:
                        build = await asyncio.to_thread(self.oracle.build, candidate)
                    finally:
                        self.busy["building"] -= 1
                        self.build_s += time.perf_counter() - t0
            return await self._checked_and_timed(task, candidate, build, queued=queued)

    def _prepare(self, task: Task) -> None:
        """The first time a task is asked for: its reference, eager timing and compile baseline start now, in
        a thread, beside the candidate's build (`Oracle.prepare_task`)."""
        if task.code in self._preparing:
            return
        loop = asyncio.get_running_loop()
        preparing = loop.run_in_executor(self._prepare_threads, self.oracle.prepare_task, task, self._quiet(loop))
        preparing.add_done_callback(_log_failure)
        self._preparing[task.code] = preparing

    async def retime(self, task_json: dict[str, Any], candidate_json: dict[str, Any]) -> dict[str, Any]:
        """Check and time a candidate again in a fresh worker (the best kernel, before it is reported), with
        eager PyTorch timed again just before it, so that its speedup compares times taken side by side."""
        task = Task.from_json(task_json)
        candidate = Candidate(**candidate_json)
        build = await asyncio.to_thread(self.oracle.build, candidate)
        return await self._checked_and_timed(task, candidate, build, fresh_baseline=True)

    async def profile(self, task_json: dict[str, Any]) -> dict[str, Any]:
        """Profile the task's reference on this oracle's device (a trusted worker, holding the device alone)."""
        from oracle.profile import profile_task

        task = Task.from_json(task_json)
        quiet = self._quiet(asyncio.get_running_loop())

        def alone() -> dict[str, Any]:
            with self.oracle.alone(label="profile"), quiet():
                return profile_task(task, self.oracle.config.device, self.oracle.threads, self.oracle.config.init_seed)

        async with self.device_slots.held():
            self.busy["timing"] += 1
            try:
                return await asyncio.to_thread(alone)
            finally:
                self.busy["timing"] -= 1

    async def _checked_and_timed(self, task: Task, candidate: Candidate, build: Any,
                                 fresh_baseline: bool = False, queued: dict[str, float] | None = None) -> dict[str, Any]:
        """The device slot: checks run with generation going on; only what is timed holds the gate. The
        verdict comes back without its torch.compile speedup (see `with_compile_baseline`), except a re-timing's,
        and with the seconds it waited for its slots (`Verdict.queued_s`)."""
        quiet = self._quiet(asyncio.get_running_loop())
        asked = time.perf_counter()
        async with self.device_slots.held(first_verdict=not fresh_baseline):
            waited = round(time.perf_counter() - asked, 4)
            self.busy["timing"] += 1
            try:
                verdict = await asyncio.to_thread(self.oracle.check_and_time, task, candidate, build, quiet, fresh_baseline)
            finally:
                self.busy["timing"] -= 1
        verdict.queued_s = {**(queued or {}), "device": waited, **verdict.queued_s}
        if fresh_baseline:
            verdict = await self._with_compile(task, verdict)
        return verdict.to_json()

    async def with_compile_baseline(self, task_json: dict[str, Any], verdict_json: dict[str, Any]) -> dict[str, Any]:
        """A correct verdict with its torch.compile speedup, once the task's baseline is measured (in the
        background, while other candidates use the device). Asked apart from `evaluate`, so that a verdict
        waiting here holds none of the search's oracle slots, and awaited, so that it holds no thread."""
        return (await self._with_compile(Task.from_json(task_json), Verdict.from_json(verdict_json))).to_json()

    async def _with_compile(self, task: Task, verdict: Verdict) -> Verdict:
        pending = self.oracle.compile_baseline_pending(task, verdict)
        if pending is None:
            return verdict
        timeout = self.oracle.compile_wait_s
        try:
            found = await asyncio.wait_for(asyncio.wrap_future(pending), timeout)
        except asyncio.TimeoutError:
            found = not_measured(timeout)
        return self.oracle.with_compile_baseline(verdict, found)

    def _quiet(self, loop: asyncio.AbstractEventLoop):
        """A context manager for the slot's thread: with a timing gate (a generator shares this GPU),
        generation is paused while it is held. The gate is awaited on this actor's event loop; a gate that
        is gone costs the pause, never the verdict."""

        def call(name: str) -> None:
            if self.gate is not None:
                with contextlib.suppress(Exception):
                    asyncio.run_coroutine_threadsafe(self._gate_call(name), loop).result(timeout=120)

        @contextlib.contextmanager
        def quiet():
            call("pause")
            try:
                yield
            finally:
                call("resume")

        return quiet

    async def _gate_call(self, name: str) -> None:
        await getattr(self.gate, name).remote(self.gate_key, self.holder)

    def close(self) -> None:
        """At the run's end: the workers on standby and the reference process end, and their folders go
        (Ray ends an actor by killing its process, which would leave the folders behind). Tasks still queued
        for preparation are dropped: the process would otherwise wait for them all as it exits."""
        self._prepare_threads.shutdown(wait=False, cancel_futures=True)
        self.oracle.close()

    def stats(self) -> dict[str, Any]:
        lock = self.oracle.quiet.lock
        return {**self.busy, "device_busy_s": lock.busy_now(), "device_exclusive_s": lock.exclusive_s,
                "device_phases_s": dict(self.oracle.device_s),
                "reference_peak_mb": self.oracle.references.peak_mb, "device_waiting": self.device_slots.waiting,
                "reference_peaks": {op: p.to_json() for op, p in self.oracle.references.process.peaks.items()},
                "device_exclusive_by": {k: [round(t, 3), n] for k, (t, n) in lock.exclusive_by_now().items()},
                "device_slots": self.oracle.config.device_slots, "build_s": self.build_s,
                "alive_s": time.time() - self.started, "ready_at": self.started, "init_s": self.init_s,
                "first_evaluate_at": self.first_evaluate_at,
                "pid": os.getpid()}


def _log_failure(done: asyncio.Future) -> None:
    """A preparation that failed costs its head start only (the check makes the reference again): say why in
    the actor's log."""
    if not done.cancelled() and done.exception() is not None:
        print(f"preparing a task failed: {type(done.exception()).__name__}: {done.exception()}", flush=True)
