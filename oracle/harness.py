"""What runs inside a worker process: build a candidate, or check and time it.

Each entry point is started in a fresh process forked from a server that has imported torch but not
touched CUDA (see `oracle.sandbox`). The candidate's outputs are handed to the trusted reference process
where they are, in device memory (`oracle.shared_tensors`), and compared there; expected outputs never
exist in a candidate's process. The helpers that make a task's inputs and model are shared with the
trusted side (`oracle.reference_server`), so both sides see the same inputs for the same seed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import resource
import sys
import threading
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch

from oracle import floor, kernels_seen, timing  # noqa: F401 - binds the clock and CUDA functions before any candidate code runs
from oracle.build import BuildFailed, BuildRecord, install_build_hooks
from oracle.cores import nice_own_group
from oracle.protocol import BuildResult, CandidateJob, Case, Checked, OutputsReady, WorkerResult, receive, send
from oracle.shared_tensors import export_tensor
from tasks.runtime import TaskModule, exec_task_code, one_line, task_constants, tensors_in

MAX_FILE_BYTES = 8 * 1024**3  # default: a worker that writes a file larger than this is killed (SIGXFSZ)
POISON_MAX_BYTES = 2 * 1024**3


def _enter_worker(job_dir: Path) -> dict[str, Any]:
    """Own process group, private folder, stdout discarded and stderr to a file, file-size limit; returns the job."""
    _enter_private(job_dir)
    return _read_job(job_dir)


def _enter_private(job_dir: Path) -> None:
    """Own process group, private folder, stdout discarded and stderr to a file.

    Nobody reads the worker's stdout (the protocol is the pipe), so it goes to /dev/null: a candidate that
    prints a fake verdict or hundreds of MB writes nothing anywhere. stderr (for the message's last line)
    goes to a file, capped by RLIMIT_FSIZE once the job is read: writing past the cap kills the worker
    (SIGXFSZ)."""
    os.setsid()
    nice_own_group(os.getpriority(os.PRIO_PROCESS, 0))  # the new session's scheduling group: the worker's nice
    _die_with_parent()
    os.chdir(job_dir)
    os.environ["TMPDIR"] = str(job_dir)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    f = os.open(job_dir / "stderr.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(f, 2)
    os.close(f)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _read_job(job_dir: Path) -> dict[str, Any]:
    """The job, and the limits it sets: the file-size cap, the torch threads."""
    job = json.loads((job_dir / "job.json").read_text())
    limit = int(job.get("max_file_bytes") or MAX_FILE_BYTES)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    torch.set_num_threads(job.get("threads") or torch.get_num_threads())
    return job


def _die_with_parent() -> None:
    """Linux: SIGKILL this worker when the fork server (its parent) goes, so a dead oracle leaves no
    candidate spinning in a loop behind it."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:
        os._exit(1)


def _device_setup(device: str) -> None:
    # Full fp32 on both sides: with TF32, a library conv and an exact fp32 kernel differ by ~1e-3.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if device == "cuda":
        torch.cuda.set_device(0)
        torch.cuda.init()


# ---------------------------------------------------------------- build


def build_entry(conn: Connection, job_dir: str) -> None:
    """Import the candidate with CUDA hidden: this compiles its extensions into the cache, nothing runs."""
    job = _enter_worker(Path(job_dir))
    record = BuildRecord()
    install_build_hooks(Path(job["cache"]), job.get("gpu_arch"), record, Path(job["pch"]) if job.get("pch") else None)
    send(conn, phase="build", deadline_s=job["build_timeout_s"])
    error_kind, message = None, ""
    try:
        _import_candidate(job["candidate_path"], job.get("backend"))
    except BuildFailed as exc:
        error_kind, message = "compile", str(exc)
    except BaseException as exc:  # noqa: BLE001 - SystemExit too: the candidate's import is foreign code
        error_kind, message = "import", one_line(exc)
    send(conn, result=BuildResult(extensions=record.extensions, build_s=record.build_s, compiled=record.compiled,
                                  error_kind=error_kind, message=message, pch_used=record.pch_used,
                                  pch_wanted=record.pch_wanted, cuda_header=record.cuda_header,
                                  binding_header=record.binding_header))


def _import_candidate(path: str, backend: str | None, constants: dict[str, Any] | None = None) -> Any:
    """Import the candidate's module; `constants` (the task's module-level constants) are defined in its
    namespace first, as KernelBench defines them."""
    if backend == "triton":
        _install_triton_counter()
    spec = importlib.util.spec_from_file_location("kernelsearch_candidate", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    module.__dict__.update(constants or {})
    sys.modules["kernelsearch_candidate"] = module
    spec.loader.exec_module(module)
    return module


TRITON_LAUNCHES = {"count": 0}


def _install_triton_counter() -> None:
    """Count Triton kernel launches (compiled or interpreted), for the own-kernel check."""
    try:
        import triton.runtime.jit as jit
    except Exception:  # noqa: BLE001 - no triton: nothing to count
        return
    classes = [jit.JITFunction]
    try:
        from triton.runtime.interpreter import InterpretedFunction

        classes.append(InterpretedFunction)
    except Exception:  # noqa: BLE001
        pass
    for cls in classes:
        original = cls.run

        def run(self, *args, __original=original, **kwargs):
            TRITON_LAUNCHES["count"] += 1
            return __original(self, *args, **kwargs)

        cls.run = run


# ---------------------------------------------------------------- shared by candidate and reference


def _seeded_inputs(module: TaskModule, seed: int, device: str) -> list[Any]:
    """The task's inputs for `seed`, made on the device itself: a GB of random numbers takes milliseconds
    there and seconds on the host. The same seed gives the same inputs in every process."""
    torch.manual_seed(seed)
    with torch.device(device):
        inputs = module.get_inputs()
    return [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]


def _reference_model(module: TaskModule, init_seed: int, device: str) -> torch.nn.Module:
    """The task's model, its parameters made on the device itself: a 32768 x 32768 linear layer takes
    seconds to initialise on the host and milliseconds on a GPU. Seeded, so every process that makes it on
    the device gets the same values (the candidate's worker copies them, `_run_candidate`)."""
    return _made_on(device, init_seed, module.make_model)


def _made_on(device: str, seed: int, make: Any) -> torch.nn.Module:
    """`make()` with factory functions defaulting to `device`, seeded; on the host where that fails (an
    __init__ that needs host tensors), the same way in every process, since the code is the same."""
    torch.manual_seed(seed)
    try:
        with torch.device(device):
            model = make()
    except Exception:  # noqa: BLE001 - the task's or candidate's own __init__; its error shows on the host
        torch.manual_seed(seed)
        model = make()
    return model.to(device)


def _flat_outputs(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (list, tuple)) else [out]


def warm_profiler(device: str) -> threading.Thread:
    """Make the first use of what `_profile_call_timed` uses in the background: the first call under a
    dispatch mode (about 0.8 s: torch imports its machinery) and, on a GPU, the profiler's first start
    (CUPTI loaded and set up, some tens of ms). In a fresh worker process these would follow the checks;
    this way they overlap the process's wait for its job (on standby) or its import. Join the thread
    before the checks: it holds the interpreter lock for most of its run."""

    def warm() -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        class PassThrough(TorchDispatchMode):  # modes are per thread: the candidate's calls do not see it
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                return func(*args, **(kwargs or {}))

        try:
            with PassThrough():
                torch.zeros(2).add_(1)  # a host tensor: no device work beside the checks
            if device == "cuda":
                kernels_seen.start_once()
        except Exception:  # noqa: BLE001 - the profiled call meets the same fault and reports it
            pass

    thread = threading.Thread(target=warm, name="profiling warm-up", daemon=True)
    thread.start()
    return thread


def warmed_up(conn: Connection, warming: threading.Thread, deadline_s: float) -> None:
    """Wait for the warm-up before the checks, as a phase of its own (`warm-up`) when it is still running.
    Not beside them: while it starts the profiler it holds the interpreter lock, and the thread issuing the
    checks' launches made 640 in 2 s against 34,500 (benchmarks/profiler_race.py). A worker on standby has
    long finished; one started for its job waits here."""
    if warming.is_alive():
        send(conn, phase="warm-up", deadline_s=deadline_s)
        warming.join()


# Profiled calls that may see no kernel at all before the candidate is taken at its word: a CUDA session
# recorded nothing now and then on an H200 (a correct ReLU kernel was then rejected as running none of its
# own kernels), while a call that computes on the device always launches one.
PROFILE_TRIES = 3


@dataclass
class Profiled:
    """One call seen at the dispatcher and, on a GPU, by the CUDA profiler."""

    ops: list[str]  # operator names (`aten::relu`)
    kernels: list[str]  # GPU kernel names
    kernel_ms: float | None  # the GPU time of those kernels (None on a CPU)
    sessions: list[list[int]] = field(default_factory=list)  # what each profiling session recorded (`Seen.counts`)
    blind: bool = False  # every session recorded nothing, not even its own fillers: the kernels are unknown


def _profile_call(fn, inputs: list[Any], device: str) -> tuple[list[str], list[str]]:
    profiled = _profile_call_timed(fn, inputs, device)
    return profiled.ops, profiled.kernels


def _profile_call_timed(fn, inputs: list[Any], device: str) -> Profiled:
    """Operator names and GPU kernel names seen during one call, and the GPU time of its kernels: against the
    timed median, how busy the GPU is during a call.

    Operators are caught at the dispatcher, so calls made from inside a C++ extension count too.
    Kernel names come from one CUDA profiling session (`oracle.kernels_seen`), so only on a GPU.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    ops: set[str] = set()

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops.add("aten::" + func.__name__.split(".")[0]) if func.namespace == "aten" else ops.add(str(func))
            return func(*args, **(kwargs or {}))

    with Recorder():
        fn(*inputs)
    timing.sync(device)
    if device != "cuda":
        return Profiled(sorted(ops), [], None)
    sessions: list[kernels_seen.Seen] = []
    for _ in range(PROFILE_TRIES):
        with kernels_seen.kernels_seen() as seen:  # led by fillers: a session's first kernel records may be lost
            fn(*inputs)
        sessions.append(seen)
        if seen.names:
            break
    return Profiled(sorted(ops), sorted(seen.names), seen.gpu_ms, [s.counts() for s in sessions],
                    blind=all(s.blind for s in sessions))


# ---------------------------------------------------------------- candidate (untrusted)


STANDBY_FILE = "standby.json"  # in a worker's folder at its start: it starts ahead of its job (oracle.standby)


def candidate_entry(conn: Connection, job_dir: str) -> None:
    """A candidate's worker. Started with its job, or on standby (`STANDBY_FILE` names the device): then it
    sets up the device and warms up its profiling first, and reads its job when the trusted side says `job`,
    so a candidate does not wait for a process to start."""
    folder = Path(job_dir)
    ready: tuple[CandidateJob, threading.Thread] | None = None
    if (folder / STANDBY_FILE).exists():
        ready = _on_standby(conn, folder)
        if ready is None:
            return  # closed unused, or its setup failed: the oracle starts a worker the ordinary way instead
    else:
        job = CandidateJob.from_json(_enter_worker(folder))
    try:
        if ready is None:
            _device_setup(job.device)
            ready = job, warm_profiler(job.device)
        result = _run_candidate(conn, *ready)
    except BuildFailed as exc:
        result = WorkerResult("compile_error", str(exc))
    except _Refused:
        return  # the trusted side refused an output and ends this worker
    except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt included
        result = WorkerResult("runtime_error", _exception_message(exc))
    send(conn, result=result)


def _on_standby(conn: Connection, folder: Path) -> tuple[CandidateJob, threading.Thread] | None:
    """Set up the device and warm up, then wait for the job; None when closed unused or when the setup failed
    (this worker then ends, and is not handed a candidate)."""
    try:
        _enter_private(folder)
        device = str(json.loads((folder / STANDBY_FILE).read_text())["device"])
        _device_setup(device)
        warming = warm_profiler(device)
        import torch.utils.cpp_extension  # noqa: F401 - what install_build_hooks imports, before the job
        command = receive(conn)
        if command.get("cmd") != "job":
            return None
        return CandidateJob.from_json(_read_job(folder)), warming
    except Exception:  # noqa: BLE001 - nothing of a candidate has run yet: there is nothing to report
        return None


class _Refused(Exception):
    """The trusted side did not answer `go` to shared outputs."""


class _Sharer:
    """Hands outputs to the trusted side where they are, and waits until it has read them."""

    def __init__(self, conn: Connection, share_dir: str | None) -> None:
        self.conn = conn
        self.share_dir = Path(share_dir) if share_dir else None
        self.count = 0

    def __call__(self, kind: str, index: int, outputs: list[Any]) -> None:
        descs, files = [], []
        for t in outputs:
            if not isinstance(t, torch.Tensor):
                descs.append(None)
                continue
            shared = export_tensor(t, self.share_dir, self.count)
            self.count += 1
            descs.append(shared.to_json())
            if shared.file:
                files.append(self.share_dir / shared.file)  # type: ignore[operator]
        send(self.conn, outputs=OutputsReady(kind, index, descs))
        command = receive(self.conn)
        for f in files:
            f.unlink(missing_ok=True)
        if command.get("cmd") != "go":
            raise _Refused()


def _exception_message(exc: BaseException) -> str:
    text = one_line(exc)
    if "CUDA" in text or "cuda" in text:
        text += " (CUDA error: the kernel faulted; check indexing and bounds)"
    return text


def _poison_allocator(nbytes: int, device: str) -> None:
    """Fill memory the caching allocator will hand out next with NaN, so unwritten outputs show (docs/oracle.md, "Correctness")."""
    if device != "cuda" or nbytes <= 0:
        return
    n = min(POISON_MAX_BYTES, nbytes) // 4
    block = torch.empty(n, dtype=torch.float32, device="cuda")
    block.fill_(float("nan"))
    del block


def _storage_span(t: torch.Tensor) -> tuple[int, int]:
    storage = t.untyped_storage()
    return storage.data_ptr(), storage.data_ptr() + storage.nbytes()


def _aliases(outputs: list[Any], others: list[torch.Tensor]) -> bool:
    spans = [_storage_span(t) for t in others if t.numel()]
    for out in outputs:
        if isinstance(out, torch.Tensor) and out.numel():
            lo, hi = _storage_span(out)
            if any(lo < b and a < hi for a, b in spans):
                return True
    return False


def _clocked_block(conn: Connection, fn, sets: list[list[Any]], device: str, n: int, rounds: int, keep=None) -> None:
    """Blocks of calls the trusted side times with its own clock, each between two messages: a candidate that
    patches the clocks of this process (or the oracle's own timing code in it) cannot shorten them. The
    trusted side keeps the fastest round (`oracle.evaluate.external_block`)."""
    for r in range(rounds):
        timing.sync(device)
        send(conn, clock=f"block_start {r}")
        for i in range(n):
            out = fn(*sets[i % len(sets)])
            if keep is not None:
                keep(i % len(sets), out)
        send(conn, clock=f"block_issued {r}")  # the trusted side sees how long the GPU then took to catch up
        timing.sync(device)
        send(conn, clock=f"block_end {r}")


class _Sampler:
    """Keeps, per input set, one output picked uniformly at random among all the calls made on it
    (reservoir sampling), so a candidate cannot know which timed call will be checked."""

    def __init__(self) -> None:
        self.rng = random.Random(os.urandom(16))
        self.seen: dict[int, int] = {}
        self.kept: dict[int, Any] = {}

    def __call__(self, index: int, out: Any) -> None:
        n = self.seen.get(index, 0) + 1
        self.seen[index] = n
        if self.rng.random() * n < 1.0:
            self.kept[index] = out


class _Keeper:
    """Watches the outputs of timed calls: samples them for the trusted side to check (`_Sampler`), and
    notices a call that returns storage an earlier call returned (a memoised or reused result: with the
    inputs rotated among a few sets, a cache would otherwise hit on every timed call at no cost).
    The last few outputs are held, so their memory cannot be handed out again: equal addresses mean the
    same storage."""

    def __init__(self, n_sets: int) -> None:
        self.timed = _Sampler()
        self.block = _Sampler()
        self.in_block = False
        self.recent: deque[tuple[Any, set[int]]] = deque(maxlen=n_sets + 1)
        self.repeated = False

    def __call__(self, index: int, out: Any) -> None:
        ptrs = {t.untyped_storage().data_ptr() for t in _flat_outputs(out) if isinstance(t, torch.Tensor) and t.numel()}
        if any(ptrs & previous for _, previous in self.recent):
            self.repeated = True
        self.recent.append((out, ptrs))
        (self.block if self.in_block else self.timed)(index, out)


def _share_kept(kept: dict[int, Any], kind: str, share) -> str | None:
    for k, out in kept.items():
        outputs = _flat_outputs(out)
        bad = [type(t).__name__ for t in outputs if type(t) is not torch.Tensor]
        if bad:
            return f"forward returned {', '.join(bad)} while being timed, expected plain torch.Tensor output(s)"
        share(kind, k, outputs)
    return None


def _same_layout(a: list[Any], b: list[Any]) -> bool:
    """Flat input lists whose tensors match in shape, dtype and strides and whose other values are equal."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype or x.stride() != y.stride() or x.device != y.device:
                return False
        elif isinstance(x, (int, float, bool, str, type(None))) and type(x) is type(y):
            if x != y:
                return False
        else:
            return False
    return True


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0)) if a.is_floating_point() else torch.equal(a, b))


def _run_candidate(conn: Connection, job: CandidateJob, warming: threading.Thread) -> WorkerResult:
    device = job.device
    record = BuildRecord()
    install_build_hooks(Path(job.cache), job.gpu_arch, record, Path(job.pch) if job.pch else None)
    modules = [exec_task_code(code, job.task_id) for code in job.codes]
    send(conn, phase="import", deadline_s=job.import_timeout_s)
    module = _import_candidate(job.candidate_path, job.backend, task_constants(modules[0].namespace))
    model_cls = getattr(module, "ModelNew", None)
    if not isinstance(model_cls, type) or not issubclass(model_cls, torch.nn.Module):
        return WorkerResult("runtime_error", "the module defines no ModelNew(nn.Module) class")

    models: list[torch.nn.Module] = []
    for m in modules:
        # Made on the device, as the reference process makes the reference: the same seed gives the same
        # parameters, copied where names and shapes match (a ModelNew built in the same order as Model gets
        # them by construction otherwise, as KernelBench's harness does).
        reference_state = _reference_model(m, job.init_seed, device).state_dict()
        candidate = _made_on(device, job.init_seed, lambda: model_cls(*m.get_init_inputs()))
        own = candidate.state_dict()
        matching = {k: v for k, v in reference_state.items() if k in own and own[k].shape == v.shape}
        candidate.load_state_dict(matching, strict=False)
        del reference_state
        models.append(candidate)
    param_snapshots = [[p.detach().clone() for p in m.state_dict().values()] for m in models]
    warmed_up(conn, warming, job.call_timeout_s * 3)

    share = _Sharer(conn, job.share_dir)
    first_outputs: list[Any] | None = None
    calls_before = sum(record.calls.values()) + TRITON_LAUNCHES["count"]
    live: dict[int, list[Any]] = {}  # per task size: the input tensors of the previous check
    with torch.no_grad():
        for i, case in enumerate(Case.from_json(c) for c in job.cases):
            inputs = _seeded_inputs(modules[case.code], case.seed, device)
            # From the second check on, new values are written into the same input tensors: a candidate
            # that caches results by input address (or shape) returns the stale ones and fails.
            previous = live.get(case.code)
            if previous is not None and _same_layout(previous, inputs):
                for old, new in zip(tensors_in(previous), tensors_in(inputs)):
                    old.copy_(new)
                inputs = [p if isinstance(p, torch.Tensor) else n for p, n in zip(previous, inputs)]
            live[case.code] = inputs
            in_tensors = tensors_in(inputs)
            snapshots = [t.detach().clone() for t in in_tensors]
            _poison_allocator(4 * sum(t.numel() * t.element_size() for t in in_tensors), device)
            send(conn, phase=f"call {i}", deadline_s=job.call_timeout_s)
            out = models[case.code](*inputs)
            if device == "cuda":  # launched: what is left is device work, a kernel that never ends included
                send(conn, phase=f"call {i}'s GPU work", deadline_s=job.gpu_work_timeout_s)
            timing.sync(device)
            outputs = _flat_outputs(out)
            bad = [type(t).__name__ for t in outputs if type(t) is not torch.Tensor]
            if bad:
                return WorkerResult("rejected", f"forward returned {', '.join(bad)}, expected plain torch.Tensor output(s)")
            if any(t.device.type != torch.device(device).type for t in outputs):
                return WorkerResult("incorrect", f"output is on {outputs[0].device}, expected {device}")
            params = [p for m in models for p in m.state_dict().values()]
            if _aliases(outputs, in_tensors + params):
                return WorkerResult("rejected", "the output shares memory with an input or a parameter; return a new tensor")
            if not all(_same(a, b) for a, b in zip(in_tensors, snapshots)):
                return WorkerResult("rejected", "forward modified its input tensors in place; inputs must stay unchanged")
            del snapshots
            share("check", i, outputs)
            if i == 0:
                first_outputs = outputs
            elif i == 1 and first_outputs is not None:
                share("after", 0, first_outputs)  # an earlier call's outputs must not have changed
                first_outputs = None
            send(conn, phase=f"call {i} done", deadline_s=job.call_timeout_s)
        own_calls = sum(record.calls.values()) + TRITON_LAUNCHES["count"] - calls_before
        for m, snaps in zip(models, param_snapshots):
            if not all(_same(a, b) for a, b in zip(m.state_dict().values(), snaps)):
                return WorkerResult("rejected", "forward modified the model's parameters or buffers")
        case0 = Case.from_json(job.cases[0])
        inputs0 = _seeded_inputs(modules[case0.code], case0.seed, device)
        send(conn, phase="profile", deadline_s=job.call_timeout_s * 3)
        profiled = _profile_call_timed(models[case0.code], inputs0, device)
        # the checks' last inputs and outputs go before the timing sets are made (3 GB each at a level-1
        # task's default size; held, they raised the worker's peak beyond what the oracle promised it)
        del inputs0, live, previous, first_outputs, inputs, in_tensors, out, outputs

        send(conn, checked=Checked(own_calls=own_calls, ops=profiled.ops, kernels=profiled.kernels,
                                   extensions=record.extensions, compiled_now=record.compiled,
                                   kernel_ms=profiled.kernel_ms, profile_sessions=profiled.sessions,
                                   kernels_unseen=profiled.blind))
        command = receive(conn)
        if command.get("cmd") != "time":
            return WorkerResult("checked")
        sets = [_seeded_inputs(modules[0], s, device) for s in job.timing_seeds]
        send(conn, phase="timing", deadline_s=job.time_timeout_s)
        params = timing.TimingParams(**job.timing)
        keeper = _Keeper(len(sets))
        result = timing.time_calls(models[0], sets, device, params, keep=keeper)
        # The trusted side sizes the clocked block from this time and eager's, and says how many calls
        # to make: a block sized from eager alone took minutes for a kernel 1000x slower than eager.
        send(conn, measured=result.median_ms)
        command = receive(conn)
        if command.get("cmd") != "block":
            return WorkerResult("checked")
        send(conn, phase="timing block", deadline_s=job.time_timeout_s)
        keeper.in_block = True
        rounds = min(timing.WALL_ROUNDS, max(1, int(command.get("rounds", 1))))
        _clocked_block(conn, models[0], sets, device, max(1, int(command.get("calls", 1))), rounds, keep=keeper)
        timing.sync(device)
        if keeper.repeated:
            return WorkerResult("rejected", "forward returned the same output memory in two timed calls "
                                "(a cached or reused result); return a newly computed tensor on every call")
        keeper.recent.clear()
        send(conn, phase="timed outputs", deadline_s=job.call_timeout_s)
        bad = _share_kept(keeper.timed.kept, "timed", share) or _share_kept(keeper.block.kept, "block", share)
        if bad:
            return WorkerResult("rejected", bad)
    # what this worker held at most, to set beside what the oracle promised it (`oracle.evaluate`)
    peak = {"peak_mb": round(torch.cuda.max_memory_reserved() / 2**20),
            "allocated_peak_mb": round(torch.cuda.max_memory_allocated() / 2**20)} if device == "cuda" else {}
    return WorkerResult("timed", timing={**result.to_json(), **peak})
