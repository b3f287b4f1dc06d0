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

import contextlib
import copy
import functools
import time
import traceback
from collections import OrderedDict
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Iterator

import torch

from oracle import floor, timing
from oracle.harness import _device_setup, _enter_worker, _flat_outputs, _profile_call, _reference_model, _seeded_inputs
from oracle.judge import REUSED_OUTPUT, OutputsJudged, check_name, judge_outputs, timed_name, unchanged
from oracle.protocol import Case, Compare, Compared, MemoryPeak, Prepared, PrepareTask, TimeEager, receive, send
from oracle.shared_tensors import SharedTensor, ShareError, import_tensor
from oracle.tolerance import POLICIES, Float64Scale
from tasks.runtime import exec_task_code, one_line, task_constants


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
    # From the float64 reference (None where it could not be made): ref64 - ref per output, kept in float32
    # (the difference is tiny, so float32 holds it to ~1e-7 of itself at half the memory of ref64), per
    # check case and per timing input set, and each output's float32 error scale over the checks.
    corrections: list[list[torch.Tensor | None]] | None = None
    timing_corrections: list[list[torch.Tensor | None]] | None = None
    scales: list[Float64Scale | None] | None = None
    smaller: dict[str, Any] | None = None  # the size constants that differ at the second, smaller size
    sizes: dict[str, Any] = field(default_factory=dict)  # the task's size constants

    @property
    def nbytes(self) -> int:
        kept = self.outputs + self.timing_outputs + (self.corrections or []) + (self.timing_corrections or [])
        return sum(t.numel() * t.element_size() for outs in kept for t in outs if t is not None)


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
        self._evict(room_for=request.expected_bytes)  # before, not after: the idle tasks and the new one never both
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
            working: dict[str, int] = {}  # the first timing set's call, at the task's size
            for k, seed in enumerate(request.timing_seeds):
                send(conn, phase=f"reference timing set {k}", deadline_s=request.call_timeout_s)
                with _working_memory(device, working if k == 0 else None):
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
        output_bytes = sum(t.numel() * t.element_size() for t in outputs[0] if t is not None)
        if output_bytes > request.float64_max_bytes:
            float64: Float64Result | str = (f"no float64 reference: outputs of {output_bytes / 1024**2:.3g} MB, over "
                                            f"{request.float64_max_bytes / 1024**2:.3g} MB (it would double the memory kept)")
        else:
            send(conn, phase="float64 reference", deadline_s=request.call_timeout_s * (len(cases) + len(request.timing_seeds)))
            float64 = _float64_reference(modules, models, cases, request.timing_seeds, outputs, timing_outputs, device)
        prepared = Prepared(ops=ops, kernels=kernels, floor=measured_floor, constant=constant,
                            output_bytes=output_bytes,
                            input_bytes=input_bytes,
                            param_bytes=_param_bytes(models[0]), working_bytes=working.get("bytes", 0),
                            reference_s=time.perf_counter() - started,
                            float64=float64 if isinstance(float64, str) else None)
        sizes = [task_constants(m.namespace) for m in modules]
        smaller = {k: v for k, v in sizes[1].items() if sizes[0].get(k) != v} if len(sizes) > 1 else None
        ref = TaskReference(request, modules, models, outputs, timing_outputs, prepared, smaller=smaller, sizes=sizes[0])
        if not isinstance(float64, str):
            ref.corrections, ref.timing_corrections, ref.scales = float64
        prepared.kept_bytes = ref.nbytes
        self.tasks[request.key] = ref
        self._evict()
        return prepared

    def _evict(self, room_for: int = 0) -> None:
        """Least recently used out, while over budget with `room_for` bytes more; tasks in use stay, and so
        does the newest one unless room is asked for a task to come. What was dropped goes back to the device
        (the caching allocator would otherwise keep it from the candidates' processes)."""
        dropped = False
        while sum(t.nbytes for t in self.tasks.values()) + room_for > self.budget_bytes:
            keys = list(self.tasks)
            idle = [k for k in (keys if room_for else keys[:-1]) if self.tasks[k].sessions == 0]
            if not idle:
                break
            del self.tasks[idle[0]]
            dropped = True
        if self.device == "cuda" and (dropped or not room_for):
            torch.cuda.empty_cache()

    def time_eager(self, request: TimeEager, conn: Connection) -> dict[str, Any]:
        ref = self.tasks[request.key]
        send(conn, phase="timing eager", deadline_s=request.deadline_s)
        params = timing.TimingParams(**request.timing)
        modules, model = ref.modules, ref.models[0]
        with torch.no_grad():
            sets = [_seeded_inputs(modules[0], s, self.device) for s in ref.request.timing_seeds]
            keep = timing.held_like_a_candidate(self.device, len(sets))  # as the candidate's timing holds its own
            eager = timing.time_calls(model, sets, self.device, params, keep=keep).to_json()
            n = timing.block_calls(eager["median_ms"], params.wall_block(eager["median_ms"]))
            rounds = timing.block_rounds(n, eager["median_ms"])  # as many as a candidate's clocked block has
            eager["external_ms"] = min(timing.back_to_back(model, sets, self.device, n, keep)[0] for _ in range(rounds))
            eager["block_calls"] = n
        if self.device == "cuda" and ref.prepared.input_bytes + ref.prepared.output_bytes > 256 * 1024**2:
            del sets
            torch.cuda.empty_cache()  # the timing's input sets: leave the memory to the candidates
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
        if request.kind == "check":
            if not 0 <= request.index < len(ref.outputs):
                raise ValueError("no such check")
            cases = [Case.from_json(c) for c in ref.request.cases]
            where = check_name(request.index, len(cases), ref.smaller if cases[request.index].code > 0 else None,
                               ref.sizes)
            judged = _judged(outs, ref.outputs[request.index], where, request.policy,
                             ref.corrections[request.index] if ref.corrections else None, ref.scales)
            if request.index == 0 and judged.passes:
                session.first_outputs = outs
        elif request.kind == "after":
            judged = OutputsJudged(None, list(POLICIES))
            if session.first_outputs is not None and not unchanged(session.first_outputs, outs):
                judged = OutputsJudged(REUSED_OUTPUT, [])
        elif request.kind in ("timed", "block"):
            if not 0 <= request.index < len(ref.timing_outputs):
                raise ValueError("no such timing input set")
            judged = _judged(outs, ref.timing_outputs[request.index], timed_name(request.kind, request.index),
                             request.policy, ref.timing_corrections[request.index] if ref.timing_corrections else None,
                             ref.scales)
            if judged.problem:
                judged.problem += "; the output must be right on every call"
        else:
            raise ValueError(f"unknown comparison {request.kind!r}")
        del outs
        if self.device == "cuda" and ref.prepared.output_bytes > 256 * 1024**2:
            torch.cuda.empty_cache()  # large copies: leave the memory to the candidates
        figures = judged.figures
        if figures is not None and ref.prepared.float64:
            figures.float64 = ref.prepared.float64
        return Compared(judged.problem is None, judged.problem or "", seconds=time.perf_counter() - started,
                        passes=judged.passes, errors=figures.to_json() if figures is not None else None)


def _judged(outs: list[torch.Tensor | None], expected: list[torch.Tensor | None], where: str, policy: str,
            corrections: list[torch.Tensor | None] | None, scales: list[Float64Scale | None] | None) -> OutputsJudged:
    """`judge_outputs` on the device, or on the host when the comparison's temporaries do not fit there or
    an output was copied to the host (`import_tensor`, a full device)."""
    apart = any(o is not None and e is not None and o.device != e.device for o, e in zip(outs, expected))
    if not apart:
        try:
            return judge_outputs(outs, expected, where, policy, corrections, scales)
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
    host = lambda ts: None if ts is None else [t.cpu() if t is not None else None for t in ts]  # noqa: E731
    return judge_outputs(host(outs), host(expected), where, policy, host(corrections), scales)


Float64Result = tuple[list[list[torch.Tensor | None]], list[list[torch.Tensor | None]], list[Float64Scale | None]]


def _float64_reference(modules: list[Any], models: list[torch.nn.Module], cases: list[Case], timing_seeds: list[int],
                       outputs: list[list[torch.Tensor | None]], timing_outputs: list[list[torch.Tensor | None]],
                       device: str) -> Float64Result | str:
    """The reference again in float64: the same inputs cast to float64, a float64 copy of the model, its
    own floating tensors made in float64. Returns per check and per timing set ref64 - ref (float32), and
    each output's scale; or, where float64 cannot be computed (no float64 kernel, out of memory), why not."""
    if not any(t is not None and t.is_floating_point() for outs in outputs for t in outs):
        return [[None] * len(o) for o in outputs], [[None] * len(o) for o in timing_outputs], [None] * len(outputs[0])
    try:
        doubles = [copy.deepcopy(m).double() for m in models]
        corrections = [_corrections(doubles[c.code], modules[c.code], c.seed, outs, device) for c, outs in zip(cases, outputs)]
        timing_corr = [_corrections(doubles[0], modules[0], s, outs, device) for s, outs in zip(timing_seeds, timing_outputs)]
    except torch.OutOfMemoryError:
        return "no float64 reference: out of device memory"
    except Exception as exc:  # noqa: BLE001 - an operator without a float64 kernel, a dtype the task pins
        return f"no float64 reference: {one_line(exc)}"[:300]
    finally:
        if device == "cuda":
            torch.cuda.empty_cache()
    scales: list[Float64Scale | None] = []
    for j in range(len(outputs[0])):
        found = [_scale(outs[j], corr[j]) for outs, corr in zip(outputs, corrections)]
        known = [f for f in found if f is not None]
        scales.append(functools.reduce(Float64Scale.merged, known) if known else None)
    return corrections, timing_corr, scales


def _corrections(model64: torch.nn.Module, module: Any, seed: int, expected: list[torch.Tensor | None],
                 device: str) -> list[torch.Tensor | None]:
    inputs = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
              for x in _seeded_inputs(module, seed, device)]
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # tensors the forward makes itself (torch.ones(...)) in float64 too
    try:
        with torch.no_grad():
            outs = _kept(model64(*inputs))
    finally:
        torch.set_default_dtype(default)
    if len(outs) != len(expected):
        raise ValueError("the float64 model returned another number of outputs")
    kept: list[torch.Tensor | None] = []
    for out, ref in zip(outs, expected):
        if ref is None or out is None or not ref.is_floating_point() or out.shape != ref.shape:
            if ref is not None and out is not None and out.shape != ref.shape:
                raise ValueError("the float64 model's output has another shape")
            kept.append(None)
            continue
        finite = torch.isfinite(ref) & torch.isfinite(out)
        kept.append(torch.where(finite, out.double() - ref.double(), 0).float())
    return kept


def _scale(ref: torch.Tensor | None, correction: torch.Tensor | None) -> Float64Scale | None:
    """The float32 reference's own error on one check: ||ref - ref64|| over ||ref64||, max over max."""
    if ref is None or correction is None:
        return None
    finite = torch.isfinite(ref)
    ref64 = torch.where(finite, ref.double() + correction.double(), 0)
    norm, peak = float(torch.linalg.vector_norm(ref64)), float(ref64.abs().max()) if ref64.numel() else 0.0
    d_norm, d_peak = float(torch.linalg.vector_norm(correction.double())), float(correction.abs().max()) if correction.numel() else 0.0
    return Float64Scale(d_norm / norm if norm > 0 else 0.0, d_peak / peak if peak > 0 else 0.0)


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
        if job["device"] == "cuda":
            torch.cuda.reset_peak_memory_stats()  # each request's own peak (`MemoryPeak`)
        try:
            if op == "prepare":
                reply: Any = state.prepare(PrepareTask.from_json(args), conn).to_json()
            elif op == "time_eager":
                reply = state.time_eager(TimeEager.from_json(args), conn)
            elif op == "open":
                reply = state.open(str(args["key"]))
            elif op == "compare":
                reply = state.compare(Compare.from_json(args)).to_json()
                if not reply["ok"]:  # its own peak: wrong outputs take the full comparison, not the quick one
                    op = "compare wrong"
            elif op == "close":
                reply = state.close(int(args["session"]))
            else:
                raise ValueError(f"unknown request {op!r}")
            answer: dict[str, Any] = {"reply": reply}
        except KeyError as exc:
            answer = {"missing": str(exc)}
        except BaseException as exc:  # noqa: BLE001 - the task's own code failed: say so, keep serving
            answer = {"error": one_line(exc), "traceback": traceback.format_exc()[-2000:]}
        if job["device"] == "cuda":
            answer["peak_of"] = op
            answer["peak"] = MemoryPeak(round(torch.cuda.max_memory_reserved() / 2**20),
                                        round(torch.cuda.max_memory_allocated() / 2**20)).to_json()
        send(conn, phase="idle", deadline_s=10**9)  # first: the client's next request sets its own deadline
        send(conn, **answer)


@contextlib.contextmanager
def _working_memory(device: str, found: dict[str, int] | None) -> Iterator[None]:
    """Into `found["bytes"]`: what the block allocates on a GPU at its peak beyond what was allocated before
    it, so that a torch.compile worker is promised what the task's call needs, intermediates included, not
    a guess from its inputs and outputs. It resets the allocator's peak: the request's own peak
    (`MemoryPeak`) counts from here, past the model's creation and the checks' first calls."""
    if device != "cuda" or found is None:
        yield
        return
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    yield
    torch.cuda.synchronize()
    found["bytes"] = torch.cuda.max_memory_allocated() - before


def _param_bytes(model: torch.nn.Module) -> int:
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def _reserved_mb(device: str) -> float | None:
    """The most device memory this process's allocator has reserved (since the last reset), in MiB."""
    return round(torch.cuda.max_memory_reserved() / 2**20, 1) if device == "cuda" else None


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
        # One Triton compile at a time inside each worker: the workers themselves run side by side, and a
        # pool of compile subprocesses per worker costs more to start than a reference's few kernels take.
        # Set here, not through TORCHINDUCTOR_COMPILE_THREADS: inductor's config was read in the fork server.
        import torch._inductor.config as inductor_config

        inductor_config.compile_threads = 1
        with torch.no_grad():
            compiled = torch.compile(model)
            # Compiled on the first timing set alone, which is then freed: the trusted side promises this
            # worker the room of every timing set only for its timing (`oracle.reference.compile_worker_bytes`).
            compiled(*_seeded_inputs(module, job["timing_seeds"][0], device))
            timing.sync(device)
            compiling_mb = _reserved_mb(device)  # what compiling took, against what it was promised
            if device == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            send(conn, ready=True, reserved_mb=compiling_mb)
            command = receive(conn)
            if command.get("cmd") != "time":
                return
            send(conn, phase="timing torch.compile", deadline_s=job["time_timeout_s"])
            sets = [_seeded_inputs(module, s, device) for s in job["timing_seeds"]]
            for inputs in sets:  # every input set's path warm (same shapes: nothing compiles again)
                compiled(*inputs)
            timing.sync(device)
            keep = timing.held_like_a_candidate(device, len(sets))
            result: dict[str, Any] = {"compile": timing.time_calls(compiled, sets, device, params, keep=keep).to_json(),
                                      "reserved_mb": _reserved_mb(device)}
    except BaseException as exc:  # noqa: BLE001 - a task torch.compile cannot handle
        result = {"compile_error": one_line(exc)}
    send(conn, result=result)
