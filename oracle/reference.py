"""The trusted side's view of each task's reference: kept in the reference process, baselines on disk.

`References` is what the oracle asks: `get(task)` makes sure the reference process holds the task's
expected outputs (made once, reused by every candidate) and that eager PyTorch has been timed (once per
task, device and torch version; the timing is cached on disk for later runs); `compile_baseline(task)`
waits for the `torch.compile` time, which a background worker measures off the critical path. The
reference process itself is `oracle.reference_server`; this module drives it and restarts it if it dies.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import threading
import time
import weakref
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator

import torch

from oracle.protocol import Case, Compare, Compared, MemoryPeak, Prepared, PrepareTask, TimeEager
from oracle.reference_server import compile_entry, reference_server_entry
from oracle.sandbox import PhaseTimeout, Worker, WorkerDied, run_to_result
from oracle.timing import TimingParams
from tasks.fitting import shrink_once
from tasks.model import Task

# The cache's key changes with what a reference or a baseline means: 2, inputs made on the device itself
# (`oracle.harness._seeded_inputs`); 3, CPU baselines timed holding their last outputs, as candidates are.
REFERENCE_VERSION = "3"
LARGE_INPUT_MB = 256  # several times any GPU's L2 cache


class ReferenceError(Exception):
    """The task's own reference could not be computed on this device."""


class Missing(ReferenceError):
    """The reference process no longer holds what was asked for (dropped to make room, or restarted)."""


@dataclass
class Reference:
    """One task's reference as the oracle sees it: the checks it runs, what the reference computes, and
    its eager baseline. The expected outputs stay in the reference process."""

    key: str
    codes: list[str]
    cases: list[Case]
    prepared: Prepared
    eager: dict[str, Any] | None
    timing_seeds: list[int] = field(default_factory=list)
    compile: Future = field(default_factory=Future)  # {"compile": timing} or {"compile_error": text}, or None

    @property
    def ops(self) -> list[str]:
        return self.prepared.ops

    @property
    def smaller_size(self) -> bool:
        return len(self.codes) > 1


@dataclass
class ReferenceSettings:
    device: str
    device_name: str
    threads: int
    check_seeds: tuple[int, ...]
    extra_size_seed: int
    timing_seeds: tuple[int, ...]
    init_seed: int
    timing: TimingParams
    wants_compile: bool
    call_timeout_s: float
    time_timeout_s: float
    compile_timeout_s: float
    budget_bytes: int
    float64_max_bytes: int = 256 * 1024**2  # see OracleConfig.float64_max_mb
    compile_workers: int = 1  # torch.compile workers at once (each is CPU work; each also holds device memory)
    compile_workers_idle: int = 1  # the same, while no candidate is being built (`References.cores_idle`)


# What a torch.compile worker holds beyond its tensors: its CUDA context, the compiled kernels, inductor's
# own buffers (on a GPU, 0.5-1 GB a process).
COMPILE_WORKER_OVERHEAD_BYTES = 1 << 30


def compile_worker_bytes(prepared: Prepared, timing_sets: int) -> tuple[int, int]:
    """Device memory a torch.compile worker is promised: while it compiles (the model, one call's inputs,
    intermediates and outputs), then while it is timed (every timing set, one call's intermediates and
    outputs, and two more outputs the allocator keeps in flight). Apart, so that a level-1 task's timing
    sets (25.6 GB at the dataset's sizes on an H200) are held for the second or so of its timing, not for
    its whole compile.

    Where the reference process measured the task's call on the GPU (`Prepared.working_bytes`), from that:
    on an H100 the guess from inputs and outputs alone promised level-1 workers 1.7x what they took, which
    kept the baselines waiting for memory, and a level-2 GEMM worker a quarter (its weights and
    intermediates were not in the guess). Elsewhere, the guess."""
    p = prepared
    if p.working_bytes > 0:
        call = max(p.working_bytes - p.input_bytes, p.output_bytes)  # one call's own, beyond its inputs
        compiling = p.param_bytes + p.input_bytes + call
        timing = p.param_bytes + timing_sets * p.input_bytes + call + 2 * p.output_bytes
    else:
        compiling = p.input_bytes + 2 * p.output_bytes
        timing = (timing_sets + 2) * p.input_bytes + 4 * p.output_bytes
    return compiling + COMPILE_WORKER_OVERHEAD_BYTES, timing + COMPILE_WORKER_OVERHEAD_BYTES


def _until_ready(worker: Worker, timeout_s: float) -> dict[str, Any]:
    """Drive a torch.compile worker to its `ready` message, or to the result that says why it cannot be."""
    try:
        for message in worker.messages():
            if "ready" in message:
                return message
            if "result" in message:
                return message["result"]
    except PhaseTimeout as exc:
        return {"compile_error": f"{exc} took longer than {timeout_s:.0f} s"}
    except WorkerDied as exc:
        return {"compile_error": f"the torch.compile worker {exc}"}
    return {"compile_error": "the torch.compile worker ended without a result"}


@dataclass
class CompilePhases:
    """Where a torch.compile baseline's time went, in seconds (`started_at`: when it was asked for)."""

    started_at: float
    memory_s: float = 0.0  # waiting for its device memory, to compile and then to be timed
    turn_s: float = 0.0  # waiting for a compile worker's turn (`WorkerLimit`)
    compile_s: float = 0.0  # the worker's start and the compile, to `ready`
    alone_wait_s: float = 0.0  # waiting for the device alone
    time_s: float = 0.0
    # the most device memory the worker reserved compiling, then timing (MiB; None on a CPU), against
    # what it was promised (`compiling_bytes`, `timing_bytes`)
    compile_reserved_mb: float | None = None
    timing_reserved_mb: float | None = None
    compiling_bytes: int = 0
    timing_bytes: int = 0
    # whether each promise was borrowed from the candidates' share (`MemoryBudget.lend_from`)
    compile_borrowed: bool = False
    timing_borrowed: bool = False

    def took(self, phase: str, since: float) -> float:
        """Add the seconds since `since` to `phase`; now, for the next phase."""
        now = time.perf_counter()
        setattr(self, phase, round(getattr(self, phase) + now - since, 3))
        return now


class WorkerLimit:
    """At most `limit` holders at once, a limit that may change while some wait."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self.held = 0
        self._cond = threading.Condition()

    def set_limit(self, limit: int) -> None:
        with self._cond:
            self.limit = max(1, limit)
            self._cond.notify_all()

    def acquire(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self.held < self.limit)
            self.held += 1

    def release(self) -> None:
        with self._cond:
            self.held -= 1
            self._cond.notify_all()


class ResidentBudget:
    """Device memory of the tasks held in the reference process for candidates being judged now. The
    process drops idle tasks (least recently used) to stay within its budget but never one in use, so
    candidates of many large tasks at once would hold them all: a candidate's task is pinned here first,
    and a task that does not fit beside the pinned ones waits (one alone always fits). Candidates of a
    task already pinned join it at no cost."""

    def __init__(self, total_bytes: int) -> None:
        self.total = total_bytes
        self.used = 0
        self._pins: dict[str, list[int]] = {}  # key -> [holders, bytes]
        self._cond = threading.Condition()
        self._closed = False

    @contextlib.contextmanager
    def pinned(self, key: str, nbytes: int) -> Iterator[None]:
        nbytes = min(max(0, nbytes), self.total)
        with self._cond:
            while True:
                if self._closed:
                    raise ReferenceError("the reference process is closed")
                if key in self._pins:
                    self._pins[key][0] += 1
                    break
                if not self.used or self.used + nbytes <= self.total:
                    self._pins[key] = [1, nbytes]
                    self.used += nbytes
                    break
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                pin = self._pins[key]
                pin[0] -= 1
                if pin[0] == 0:
                    self.used -= pin[1]
                    del self._pins[key]
                    self._cond.notify_all()

    def close(self) -> None:
        """Those still waiting for room raise: a thread left waiting would keep its process from exiting."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class ReferenceProcess:
    """The reference process and its pipe: one request at a time, restarted when it dies."""

    def __init__(self, settings: ReferenceSettings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._worker: Worker | None = None
        self._closed = False
        self.peaks: dict[str, MemoryPeak] = {}  # per kind of request, the most device memory one took (a GPU only)

    def start(self) -> None:
        """Start the process ahead of its first request (its imports and device set-up off that request's
        path); nothing once closed."""
        with self._lock:
            if not self._closed:
                self._started()

    def request(self, op: str, args: dict[str, Any]) -> Any:
        with self._lock:
            if self._closed:  # no process is started again once the oracle closed
                raise ReferenceError("the reference process is closed")
            worker = self._started()
            try:
                if self._closed:  # closed while it started, before `close` could see it: ended here
                    raise WorkerDied("was closed")
                worker.send(op=op, args=args)
                for message in worker.messages():
                    if "peak" in message:  # of this request, under its kind (`peak_of`: "compare wrong" too)
                        peak, kind = MemoryPeak.from_json(message["peak"]), str(message.get("peak_of") or op)
                        self.peaks[kind] = self.peaks[kind].merged(peak) if kind in self.peaks else peak
                    if "reply" in message:
                        return message["reply"]
                    if "missing" in message:
                        raise Missing(f"the reference process does not hold {message['missing']}")
                    if "error" in message:
                        raise ReferenceError(str(message["error"])[:500])
            except (PhaseTimeout, WorkerDied, OSError) as exc:  # OSError: its pipe closed by `close` meanwhile
                self._stop()
                raise ReferenceError("the reference process is closed" if self._closed
                                     else f"the reference process {exc}") from None
            raise ReferenceError("the reference process ended")  # pragma: no cover

    @property
    def current(self) -> Worker | None:
        """The reference process now running, if any."""
        return self._worker

    def _started(self) -> Worker:
        if self._worker is None or not self._worker.process.is_alive():
            self._stop()
            s = self.settings
            self._worker = Worker(reference_server_entry, {"device": s.device, "threads": s.threads,
                                                           "budget_bytes": s.budget_bytes})
            # An oracle dropped without close() (a test's, a script's) takes its reference process with it.
            self._finalizer = weakref.finalize(self, self._worker.close)
        return self._worker

    def _stop(self) -> None:
        if self._worker is not None:
            self._finalizer.detach()
            self._worker.close()
            self._worker = None

    def close(self) -> None:
        """End the process, and with it a request under way (a task's reference taking minutes): its thread
        sees the process gone and raises ReferenceError; later requests raise it at once."""
        self._closed = True
        worker = self._worker
        if worker is not None:
            worker.close()  # not under the lock, which the request under way holds
        with self._lock:
            self._stop()


class References:
    """Each task's reference, made on first use and then shared by all its candidates."""

    def __init__(self, settings: ReferenceSettings, baselines: Path, alone: Callable[..., ContextManager],
                 shared: Callable[[], ContextManager], register: Callable[[Worker], ContextManager],
                 reserve: Callable[..., ContextManager] = lambda nbytes, ahead=False: contextlib.nullcontext(False)) -> None:
        self.settings = settings
        self.baselines = baselines
        self.baselines.mkdir(parents=True, exist_ok=True)
        self.process = ReferenceProcess(settings)
        self._alone = alone  # alone(own): the device alone, every other registered worker stopped
        self._shared = shared  # device work that may overlap checks, never a timing
        self._register = register  # a trusted worker that must be stopped while another times
        self._reserve = reserve  # reserve(nbytes, ahead): device memory promised to a worker
        self._known: dict[str, Reference] = {}
        self._resident = ResidentBudget(settings.budget_bytes)
        self._compiles = WorkerLimit(settings.compile_workers)
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    @property
    def peak_mb(self) -> float:
        """The most device memory the reference process reserved in any request so far (a GPU only)."""
        return max((p.reserved_mb for p in self.process.peaks.values()), default=0.0)

    def cores_idle(self, idle: bool) -> None:
        """More torch.compile workers at once while no candidate is being built or waits to be: the cores
        are free then (checks and timings are device work). Widened only once the oracle had no candidate
        at all, an H200 run still waited 44 s after its last verdict for the last 15 of 35 baselines, four
        at a time while the last candidates were judged, its builds long over."""
        s = self.settings
        self._compiles.set_limit(max(s.compile_workers, s.compile_workers_idle) if idle else s.compile_workers)

    def key(self, task: Task) -> str:
        s = self.settings
        text = f"{task.code}\0{s.device}\0{s.check_seeds}\0{s.extra_size_seed}\0{s.timing_seeds}\0{REFERENCE_VERSION}"
        return hashlib.sha256(text.encode()).hexdigest()[:20]

    def pinned(self, task: Task) -> ContextManager:
        """Hold the task in the reference process while a candidate of it is judged (see ResidentBudget);
        enter before `get`. Its size is what its last preparation reported, else a guess from its inputs."""
        key = self.key(task)
        return self._resident.pinned(key, self._kept_bytes(task, key))

    def _kept_bytes(self, task: Task, key: str) -> int:
        """What the task keeps in the reference process: as its last preparation reported it, else a guess."""
        known = self._known.get(key)
        if known is not None and known.prepared.kept_bytes:
            return known.prepared.kept_bytes
        sets = len(_cases(self.settings, len(known.codes) if known else 2)) + len(self.timing_seeds(task))
        if known is not None:
            p = known.prepared
            return sets * p.output_bytes * (1 if p.float64 else 2)  # ref64 - ref kept beside each output
        if task.output_mb:  # measured on the meta device when the task was loaded
            doubled = 2 if task.output_mb * 1024**2 <= self.settings.float64_max_bytes else 1  # ref64 - ref
            return int(sets * task.output_mb * 1024**2 * doubled)
        return int(sets * task.input_mb * 1024**2)  # outputs about the size of the inputs

    def timing_seeds(self, task: Task) -> list[int]:
        """The rotating timing input sets. Rotation keeps a small task's inputs out of the L2 cache between
        calls; inputs far larger than any cache gain nothing from it (the cache is flushed before each call
        anyway), so large tasks rotate two sets, which bounds the device memory a timing needs."""
        seeds = list(self.settings.timing_seeds)
        return seeds[:2] if task.input_mb > LARGE_INPUT_MB else seeds

    def _task_lock(self, key: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    def get(self, task: Task, quiet: Callable[[], ContextManager] = contextlib.nullcontext,
            spent: dict[str, float] | None = None) -> Reference:
        """The task's reference, prepared in the reference process (again, if it was dropped or the process
        restarted) and with its eager baseline; raises ReferenceError when the task's own code fails.
        `spent` gets the device seconds this call cost, by phase (`reference`, `baselines`)."""
        spent = {} if spent is None else spent
        key = self.key(task)
        with self._task_lock(key):
            known = self._known.get(key)
            codes = known.codes if known else _codes(task)
            cases = known.cases if known else _cases(self.settings, len(codes))
            request = self._prepare_request(task, key, codes, cases)
            with self._shared():
                prepared = Prepared.from_json(self.process.request("prepare", request.to_json()))
            if prepared.reference_s:  # measured by the reference process: no waiting counted
                spent["reference"] = spent.get("reference", 0.0) + prepared.reference_s
            if known is not None:
                known.prepared = prepared
                return known
            eager, seconds = self._eager(task, request, quiet)
            if seconds:
                spent["baselines"] = spent.get("baselines", 0.0) + seconds
            reference = Reference(key, codes, cases, prepared, eager, request.timing_seeds)
            self._known[key] = reference
            if self.settings.wants_compile:
                self._start_compile(task, reference, quiet)
            else:
                reference.compile.set_result(None)
            return reference

    def retime_eager(self, task: Task, quiet: Callable[[], ContextManager] = contextlib.nullcontext,
                     spent: dict[str, float] | None = None) -> Reference:
        """Time eager PyTorch again now, past the disk cache (the compile time is kept), so that a re-timed best
        kernel is compared with a baseline measured under the same conditions, not whenever the cache was filled."""
        spent = {} if spent is None else spent
        reference = self.get(task, quiet, spent)
        request = self._prepare_request(task, reference.key, reference.codes, reference.cases)
        eager, seconds = self._eager(task, request, quiet, fresh=True)
        reference.eager = eager
        spent["baselines"] = spent.get("baselines", 0.0) + seconds
        return reference

    def _baseline_file(self, key: str) -> Path:
        name = re.sub(r"[^A-Za-z0-9]+", "-", self.settings.device_name).strip("-")
        return self.baselines / f"{key}-{name}-torch{torch.__version__}-t{self.settings.threads}.json"

    def _read_baselines(self, key: str) -> dict[str, Any]:
        path = self._baseline_file(key)
        try:
            data = json.loads(path.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def _write_baselines(self, key: str, task: Task, **fields: Any) -> None:
        with self._guard:
            data = {**self._read_baselines(key), **fields, "device": self.settings.device_name,
                    "torch": torch.__version__, "task": task.id}
            path = self._baseline_file(key)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data))
            tmp.replace(path)

    def _prepare_request(self, task: Task, key: str, codes: list[str], cases: list[Case]) -> PrepareTask:
        s = self.settings
        return PrepareTask(key=key, task_id=task.id, codes=codes, cases=[c.to_json() for c in cases],
                           timing_seeds=self.timing_seeds(task), init_seed=s.init_seed,
                           call_timeout_s=s.call_timeout_s * 5, float64_max_bytes=s.float64_max_bytes,
                           expected_bytes=self._kept_bytes(task, key))

    def _eager(self, task: Task, request: PrepareTask, quiet: Callable[[], ContextManager],
               fresh: bool = False) -> tuple[dict | None, float]:
        key = request.key
        cached = self._read_baselines(key)
        if not fresh and cached.get("eager"):
            return cached["eager"], 0.0
        s = self.settings
        with self._alone(self.process.current, "eager baseline"), quiet():  # the reference process times: on the timing cores
            started = time.perf_counter()  # the device held alone, not the wait for it
            timed = TimeEager(key, s.timing.__dict__, s.time_timeout_s).to_json()
            try:
                eager = self.process.request("time_eager", timed)
            except Missing:  # dropped to make room for another task meanwhile: made again (the device is ours)
                self.process.request("prepare", request.to_json())
                eager = self.process.request("time_eager", timed)
            spent = time.perf_counter() - started
        if isinstance(eager, dict):
            eager = {**eager, "measured_at": time.time()}  # kept on disk: a later run knows it is not its own
        self._write_baselines(key, task, eager=eager)
        return eager, spent

    def _start_compile(self, task: Task, reference: Reference, quiet: Callable[[], ContextManager]) -> None:
        cached = self._read_baselines(reference.key)
        if "compile" in cached or "compile_error" in cached:
            reference.compile.set_result({k: cached[k] for k in ("compile", "compile_error") if k in cached})
            return
        threading.Thread(target=self._compile, args=(task, reference, quiet), daemon=True,
                         name=f"compile {task.id}").start()

    def _compile(self, task: Task, reference: Reference, quiet: Callable[[], ContextManager]) -> None:
        """In the background: compile (CPU work beside the checks), then time with the device alone."""
        s = self.settings
        job = {"device": s.device, "task_id": task.id, "code": reference.codes[0], "init_seed": s.init_seed,
               "timing_seeds": list(s.timing_seeds), "timing": s.timing.__dict__, "threads": s.threads,
               "compile_timeout_s": s.compile_timeout_s, "time_timeout_s": s.time_timeout_s}
        job["timing_seeds"] = self.timing_seeds(task)
        result: dict[str, Any] = {"compile_error": "the torch.compile worker ended without a result"}
        # where its time went, kept beside it in the disk cache: seconds waiting for device memory and for a
        # worker's turn, compiling (the worker's start included), waiting for the device alone, timing
        phases = CompilePhases(started_at=time.time())
        clock = time.perf_counter()
        compiling, timing = compile_worker_bytes(reference.prepared, len(job["timing_seeds"]))
        phases.compiling_bytes, phases.timing_bytes = compiling, timing
        try:
            with contextlib.ExitStack() as lifetime:
                # Its memory first, then a turn: a task waiting for room (a level-1 one at the dataset's
                # sizes fills the share alone) holds no turn from the tasks that fit. The worker starts
                # inside both, so nothing it allocates is unaccounted for; its turn is the compile's CPU work.
                with self._reserve(compiling) as borrowed:
                    phases.compile_borrowed = bool(borrowed)
                    clock = phases.took("memory_s", clock)
                    self._compiles.acquire()
                    try:
                        clock = phases.took("turn_s", clock)
                        worker = Worker(compile_entry, job)
                        lifetime.callback(worker.close)
                        lifetime.enter_context(self._register(worker))
                        ready = _until_ready(worker, s.compile_timeout_s)
                        clock = phases.took("compile_s", clock)
                    finally:
                        self._compiles.release()
                phases.compile_reserved_mb = ready.get("reserved_mb")
                if "ready" not in ready:  # why it could not compile
                    result = ready
                else:  # compiled, its inputs freed: the timing sets' room only now, and only for the timing
                    with self._reserve(timing, ahead=True) as borrowed:
                        phases.timing_borrowed = bool(borrowed)
                        clock = phases.took("memory_s", clock)
                        with self._alone(worker, "torch.compile baseline"), quiet():
                            clock = phases.took("alone_wait_s", clock)
                            worker.send(cmd="time")
                            outcome = run_to_result(worker, close=False)
                        clock = phases.took("time_s", clock)
                    if outcome.result is not None:
                        result = outcome.result
                        phases.timing_reserved_mb = result.get("reserved_mb")
                    elif outcome.timed_out_phase:
                        result = {"compile_error": f"{outcome.timed_out_phase} took too long"}
                    elif outcome.crashed:
                        result = {"compile_error": f"the torch.compile worker {outcome.crashed}"}
            fields = {k: result.get(k) for k in ("compile", "compile_error") if k in result}
            self._write_baselines(reference.key, task, **fields, compile_phases=asdict(phases))
        finally:
            if not reference.compile.done():
                reference.compile.set_result(result)

    def compile_future(self, task: Task) -> Future | None:
        """The task's torch.compile baseline to come (`{"compile": ...}` or `{"compile_error": ...}`); None when
        the task was never prepared here."""
        reference = self._known.get(self.key(task))
        return None if reference is None else reference.compile

    # ------------------------------------------------------------ candidates' outputs

    def open(self, task: Task, reference: Reference, quiet: Callable[[], ContextManager] = contextlib.nullcontext) -> int:
        """A session for one candidate: its check-1 outputs are kept there for the reused-buffer check."""
        try:
            return int(self.process.request("open", {"key": reference.key}))
        except Missing:  # dropped from the reference process, or it restarted: prepare again
            self.get(task, quiet)
            return int(self.process.request("open", {"key": reference.key}))

    def compare(self, session: int, kind: str, index: int, tensors: list, share_dir: str | None,
                policy: str = "kernelbench") -> Compared:
        """The outputs against the reference under every policy; `ok` and the message are `policy`'s."""
        return Compared.from_json(self.process.request("compare", Compare(session, kind, index, tensors, share_dir, policy).to_json()))

    def close_session(self, session: int) -> None:
        with contextlib.suppress(ReferenceError):
            self.process.request("close", {"session": session})

    def close(self) -> None:
        self._resident.close()
        self.process.close()


def _codes(task: Task) -> list[str]:
    smaller = shrink_once(task.code, task.id)
    return [task.code, smaller] if smaller else [task.code]


def _cases(settings: ReferenceSettings, n_codes: int) -> list[Case]:
    cases = [Case(0, s) for s in settings.check_seeds]
    if n_codes > 1:
        cases.append(Case(1, settings.extra_size_seed))
    return cases
