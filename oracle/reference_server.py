"""The trusted reference process: one per oracle (per GPU), long-lived, running the tasks' own code only.

It keeps, per task, the reference outputs of every check and timing input set in device memory, made once
and reused by every candidate of that task (least recently used out, within a memory budget; a task with a
candidate being judged is never dropped). Candidates' outputs reach it as `SharedTensor` descriptors (CUDA
IPC on a GPU, memory-backed files on a CPU); it copies them, compares them on the device with the task's
reference, and answers with the first mismatching values only. A candidate's process never holds a
reference output. It also times eager PyTorch, once per task, while the oracle holds the device alone.

`compile_entry` is a second trusted worker, started per task in the background: it compiles the reference
with `torch.compile` (seconds of CPU work, off the device's critical path) and times it when the oracle
lets it have the device alone.

Requests and replies are the records of `oracle.protocol`, one at a time over the pipe.
"""

from __future__ import annotations

import time
import traceback
from collections import OrderedDict
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch

from oracle import floor, timing
from oracle.harness import _device_setup, _enter_worker, _flat_outputs, _profile_call, _reference_model, _seeded_inputs
from oracle.judge import REUSED_OUTPUT, check_name, output_problem, timed_name, unchanged
from oracle.protocol import Case, Compare, Compared, Prepared, PrepareTask, TimeEager, receive, send
from oracle.shared_tensors import SharedTensor, ShareError, import_tensor
from tasks.runtime import exec_task_code, one_line


@dataclass
class TaskReference:
    """What the reference process keeps for one task: its models and the expected outputs."""

    request: PrepareTask
    modules: list[Any]
    models: list[torch.nn.Module]
    outputs: list[list[torch.Tensor | None]]  # per check case
    timing_outputs: list[list[torch.Tensor | None]]  # per timing input set
    prepared: Prepared
    sessions: int = 0  # candidates being judged against it now

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for outs in self.outputs + self.timing_outputs for t in outs if t is not None)


@dataclass
class Session:
    key: str
    first_outputs: list[torch.Tensor | None] | None = None  # check 1's outputs, for the reused-buffer check


@dataclass
class ReferenceState:
    device: str
    budget_bytes: int
    tasks: OrderedDict[str, TaskReference] = field(default_factory=OrderedDict)
    sessions: dict[int, Session] = field(default_factory=dict)
    next_session: int = 1

    # ------------------------------------------------------------ tasks

    def prepare(self, request: PrepareTask, conn: Connection) -> Prepared:
        if request.key in self.tasks:
            self.tasks.move_to_end(request.key)
            return Prepared(**{**self.tasks[request.key].prepared.to_json(), "reference_s": 0.0})
        started = time.perf_counter()
        device = self.device
        modules = [exec_task_code(code, request.task_id) for code in request.codes]
        models = [_reference_model(m, request.init_seed, device) for m in modules]
        cases = [Case.from_json(c) for c in request.cases]
        outputs: list[list[torch.Tensor | None]] = []
        with torch.no_grad():
            for i, case in enumerate(cases):
                send(conn, phase=f"reference call {i}", deadline_s=request.call_timeout_s)
                out = models[case.code](*_seeded_inputs(modules[case.code], case.seed, device))
                outputs.append(_kept(out))
            timing_outputs = []
            for k, seed in enumerate(request.timing_seeds):
                send(conn, phase=f"reference timing set {k}", deadline_s=request.call_timeout_s)
                timing_outputs.append(_kept(models[0](*_seeded_inputs(modules[0], seed, device))))
            timing.sync(device)
            inputs0 = _seeded_inputs(modules[cases[0].code], cases[0].seed, device)
            send(conn, phase="reference profile", deadline_s=request.call_timeout_s * 3)
            ops, kernels = _profile_call(models[0], inputs0, device)
            try:
                measured_floor: dict[str, Any] | None = floor.measure(models[0], inputs0, device).__dict__
            except Exception:  # noqa: BLE001 - a floor we cannot count is no floor, not a failure
                measured_floor = None
            input_bytes = sum(t.numel() * t.element_size() for t in inputs0 if isinstance(t, torch.Tensor))
            del inputs0
        if device == "cuda":
            torch.cuda.empty_cache()  # the temporaries of the reference calls go back to the device
        constant = all(t is None or t.numel() < 2 or bool((t == t.flatten()[0]).all()) for outs in outputs for t in outs)
        prepared = Prepared(ops=ops, kernels=kernels, floor=measured_floor, constant=constant,
                            output_bytes=sum(t.numel() * t.element_size() for t in outputs[0] if t is not None),
                            input_bytes=input_bytes,
                            reference_s=time.perf_counter() - started)
        self.tasks[request.key] = TaskReference(request, modules, models, outputs, timing_outputs, prepared)
        self._evict()
        return prepared

    def _evict(self) -> None:
        """Least recently used out, while over budget; the newest task and tasks in use stay."""
        while sum(t.nbytes for t in self.tasks.values()) > self.budget_bytes:
            idle = [k for k, t in list(self.tasks.items())[:-1] if t.sessions == 0]
            if not idle:
                return
            del self.tasks[idle[0]]
        if self.device == "cuda":
            torch.cuda.empty_cache()

    def time_eager(self, request: TimeEager, conn: Connection) -> dict[str, Any]:
        ref = self.tasks[request.key]
        send(conn, phase="timing eager", deadline_s=request.deadline_s)
        params = timing.TimingParams(**request.timing)
        modules, model = ref.modules, ref.models[0]
        with torch.no_grad():
            sets = [_seeded_inputs(modules[0], s, self.device) for s in ref.request.timing_seeds]
            eager = timing.time_calls(model, sets, self.device, params).to_json()
            n = timing.block_calls(eager["median_ms"], request.wall_calls)
            timing.sync(self.device)
            started = time.perf_counter()
            for i in range(n):
                model(*sets[i % len(sets)])
            timing.sync(self.device)
            eager["external_ms"] = (time.perf_counter() - started) * 1e3 / n
            eager["block_calls"] = n
        return eager

    # ------------------------------------------------------------ candidates

    def open(self, key: str) -> int:
        ref = self.tasks[key]  # KeyError: the client prepares the task first
        ref.sessions += 1
        number, self.next_session = self.next_session, self.next_session + 1
        self.sessions[number] = Session(key)
        return number

    def close(self, number: int) -> None:
        session = self.sessions.pop(number, None)
        if session is not None and session.key in self.tasks:
            self.tasks[session.key].sessions -= 1
            self._evict()

    def compare(self, request: Compare) -> Compared:
        started = time.perf_counter()
        session = self.sessions[request.session]
        ref = self.tasks[session.key]
        share_dir = Path(request.share_dir) if request.share_dir else None
        try:
            outs = [None if d is None else import_tensor(SharedTensor.from_json(d), share_dir) for d in request.tensors]
        except ShareError as exc:
            return Compared(False, str(exc), seconds=time.perf_counter() - started)
        problem = None
        if request.kind == "check":
            if not 0 <= request.index < len(ref.outputs):
                raise ValueError("no such check")
            cases = [Case.from_json(c) for c in ref.request.cases]
            where = check_name(request.index, len(cases), cases[request.index].code > 0)
            problem = _problem(outs, ref.outputs[request.index], where)
            if request.index == 0 and problem is None:
                session.first_outputs = outs
        elif request.kind == "after":
            if session.first_outputs is not None and not unchanged(session.first_outputs, outs):
                problem = REUSED_OUTPUT
        elif request.kind in ("timed", "block"):
            if not 0 <= request.index < len(ref.timing_outputs):
                raise ValueError("no such timing input set")
            wrong = _problem(outs, ref.timing_outputs[request.index], timed_name(request.kind, request.index))
            problem = f"{wrong}; the output must be right on every call" if wrong else None
        else:
            raise ValueError(f"unknown comparison {request.kind!r}")
        del outs
        if self.device == "cuda" and ref.prepared.output_bytes > 256 * 1024**2:
            torch.cuda.empty_cache()  # large copies: leave the memory to the candidates
        return Compared(problem is None, problem or "", seconds=time.perf_counter() - started)


def _problem(outs: list[torch.Tensor | None], expected: list[torch.Tensor | None], where: str) -> str | None:
    """`output_problem` on the device, or on the host when the comparison's temporaries do not fit there."""
    try:
        return output_problem(outs, expected, where)
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        host = lambda ts: [t.cpu() if t is not None else None for t in ts]  # noqa: E731
        return output_problem(host(outs), host(expected), where)


def _kept(out: Any) -> list[torch.Tensor | None]:
    return [t.detach().contiguous() if isinstance(t, torch.Tensor) else None for t in _flat_outputs(out)]


# ---------------------------------------------------------------- the process


def reference_server_entry(conn: Connection, job_dir: str) -> None:
    """Serve requests until the pipe closes: each is `{op, args}`, each answer `{reply}` or `{error}`."""
    job = _enter_worker(Path(job_dir))
    state = ReferenceState(job["device"], int(job["budget_bytes"]))
    try:
        _device_setup(job["device"])
    except BaseException as exc:  # noqa: BLE001
        send(conn, error=f"the reference process could not use the device: {one_line(exc)}")
        return
    send(conn, phase="idle", deadline_s=10**9)
    while True:
        try:
            request = receive(conn)
        except (EOFError, OSError):
            return
        op, args = request.get("op"), request.get("args") or {}
        try:
            if op == "prepare":
                reply: Any = state.prepare(PrepareTask.from_json(args), conn).to_json()
            elif op == "time_eager":
                reply = state.time_eager(TimeEager.from_json(args), conn)
            elif op == "open":
                reply = state.open(str(args["key"]))
            elif op == "compare":
                reply = state.compare(Compare.from_json(args)).to_json()
            elif op == "close":
                reply = state.close(int(args["session"]))
            else:
                raise ValueError(f"unknown request {op!r}")
            answer: dict[str, Any] = {"reply": reply}
        except KeyError as exc:
            answer = {"missing": str(exc)}
        except BaseException as exc:  # noqa: BLE001 - the task's own code failed: say so, keep serving
            answer = {"error": one_line(exc), "traceback": traceback.format_exc()[-2000:]}
        send(conn, phase="idle", deadline_s=10**9)  # first: the client's next request sets its own deadline
        send(conn, **answer)


def compile_entry(conn: Connection, job_dir: str) -> None:
    """Compile the task's reference with `torch.compile`, say `ready`, then time it on `cmd: time`."""
    job = _enter_worker(Path(job_dir))
    device = job["device"]
    try:
        _device_setup(device)
        module = exec_task_code(job["code"], job["task_id"])
        model = _reference_model(module, job["init_seed"], device)
        params = timing.TimingParams(**job["timing"])
        send(conn, phase="compiling", deadline_s=job["compile_timeout_s"])
        with torch.no_grad():
            sets = [_seeded_inputs(module, s, device) for s in job["timing_seeds"]]
            compiled = torch.compile(model)
            for inputs in sets:  # compiles, and warms every input set's path
                compiled(*inputs)
            timing.sync(device)
            send(conn, ready=True)
            command = receive(conn)
            if command.get("cmd") != "time":
                return
            send(conn, phase="timing torch.compile", deadline_s=job["time_timeout_s"])
            result: dict[str, Any] = {"compile": timing.time_calls(compiled, sets, device, params).to_json()}
    except BaseException as exc:  # noqa: BLE001 - a task torch.compile cannot handle
        result = {"compile_error": one_line(exc)}
    send(conn, result=result)
