"""The oracle: extract, build, check and time one candidate against a task, and give the verdict.

The work is split the way the search schedules it: `build` needs only CPU (a build slot), `check_and_time`
needs the device (a device slot). `evaluate` does both in turn. The parts, each in a module of its own:
- `oracle.build.CandidateBuilds`: each candidate is built once, with the device hidden, into a cache;
- `oracle.reference.References`: each task's reference outputs, kept on the device by a trusted process
  and reused by every candidate of the task; its eager baseline (timed once) and its `torch.compile`
  baseline (measured in the background);
- `oracle.harness`: what runs in the candidate's worker; outputs are handed over in device memory
  (`oracle.shared_tensors`) and compared by the trusted process;
- `oracle.judge`: the rules, as pure functions; `oracle.device_quiet`: who runs while something is timed.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager

from oracle import gpu_lock, judge
from oracle.build import BuildOutcome, CandidateBuilds, build_key, cache_root, last_line, lite_binding_available
from oracle.candidate import Candidate
from oracle.cores import plan_cores
from oracle.device_quiet import MeasuredPeaks, MemoryBudget, QuietDevice
from oracle.extract import candidate_from_completion
from oracle.pch import HEADER as FULL_PCH, LITE_BINDING, default_root
from oracle.protocol import CandidateJob, Checked, ErrorFigures, OutputsReady, Prepared
from oracle.reference import Reference, ReferenceError, References, ReferenceSettings
from oracle.sandbox import PhaseTimeout, Worker, WorkerDied, start_fork_server
from oracle.standby import StandbyWorkers
from oracle.timing import WALL_ROUNDS, TimingParams, block_calls, block_rounds
from oracle.tolerance import DEFAULT_POLICY, FALLBACK_FLAG, POLICIES, check_policy
from oracle.verdict import Verdict
from tasks.model import Task

__all__ = ["BuildOutcome", "Oracle", "OracleConfig", "ReferenceError", "build_key"]


@dataclass
class OracleConfig:
    device: str = "cpu"
    allow_torch: bool = False  # accept plain-PyTorch rewrites (studies of PyTorch-level rewrites)
    check_seeds: tuple[int, ...] = (11, 12, 13, 14, 15)  # at least 5 fresh seeds at the task's size
    extra_size_seed: int = 21  # and one at a smaller size, where the task allows it
    timing_seeds: tuple[int, ...] = (101, 102, 103, 104)  # the rotating input sets
    init_seed: int = 42
    timing: TimingParams = field(default_factory=TimingParams)
    compile_baseline: bool | None = None  # None: on cuda only (torch.compile on a CPU takes minutes a task)
    build_timeout_s: float = 900.0
    import_timeout_s: float = 300.0
    call_timeout_s: float = 60.0
    # On a GPU, a call's device work after its forward returned (its launches are asynchronous), at least;
    # `gpu_work_eager_factor` times eager's call when that is longer. A kernel that never ends holds the
    # device for this long, not for the call's minute (JIT compiles and first-call set-up happen inside
    # forward), and every other check and timing waits behind it: at 1000 times, a hang on a level-2 task
    # whose eager call takes 24 ms held the whole device for 24 s.
    gpu_work_timeout_s: float = 10.0
    gpu_work_eager_factor: float = 100.0
    time_timeout_s: float = 300.0
    compile_timeout_s: float = 600.0
    compile_workers: int | None = None  # torch.compile baselines made at once (default: a quarter of the cores, 1-4)
    # the same while the oracle has no candidate to build or waiting for a build (default: half the cores, up to 8)
    compile_workers_idle: int | None = None
    cache_dir: Path | None = None
    threads: int | None = None  # torch threads in workers (default: every core, the same for candidate and baselines)
    precompiled_headers: bool = True  # build C++ halves against a precompiled torch/extension.h (oracle.pch)
    stop_builds_while_timing: bool = True  # on a CPU: compilers share the cores being timed
    # Builds and header makers kept off a core (oracle.cores), at a lower priority, so that the timing
    # thread never waits for one between launches. None: on CUDA (on a CPU the builds are stopped instead).
    reserve_timing_cores: bool | None = None
    pch_dir: Path | None = None  # where those headers live (default: oracle.pch.default_root())
    check_slots: int | None = None  # candidates checked at once on the device (default: 4 on a GPU, 1 on a CPU)
    # workers started ahead of their candidates (oracle.standby; default: one per device slot; 0: none)
    standby_workers: int | None = None
    # share of the device's memory the kept reference outputs may use. At 0.2 (with 0.4 for the workers) an
    # H200 held a level-1 elementwise task (22.5 GiB kept) with small tasks beside it, but two comparisons
    # ran out of device memory and fell back to the host (35 s each), and fewer candidates were judged.
    reference_memory: float = 0.15
    candidate_memory: float = 0.45  # share the candidates' workers may be promised at once
    # share the torch.compile workers may be promised at once: apart, so that baselines made in the
    # background never keep a candidate's checks waiting for memory
    compile_memory: float = 0.2
    tolerance: str = DEFAULT_POLICY  # the tolerance policy verdicts follow (oracle.tolerance)
    # Outputs larger than this get no float64 reference (`numeric` then judges as `kernelbench`, and says so):
    # ref64 - ref kept for every check and timing set doubles what the reference process holds, and making
    # it takes float64 copies of inputs and outputs (about 50 GB more for a 3 GB elementwise task).
    float64_max_mb: float = 256.0

    def __post_init__(self) -> None:
        check_policy(self.tolerance)

    @property
    def device_slots(self) -> int:
        """On a CPU the checks would compete for the cores that time: one candidate at a time there."""
        return self.check_slots or (4 if self.device == "cuda" else 1)

    @property
    def reserves_cores(self) -> bool:
        return self.device == "cuda" if self.reserve_timing_cores is None else self.reserve_timing_cores

    @property
    def wants_compile(self) -> bool:
        return self.device == "cuda" if self.compile_baseline is None else self.compile_baseline


def gpu_work_limit_s(config: OracleConfig, eager: dict[str, Any] | None) -> float:
    """A call's GPU work after its forward returned: `gpu_work_timeout_s`, or `gpu_work_eager_factor` times
    eager's call when that is longer; never past the whole call's limit."""
    eager_s = ((eager or {}).get("median_ms") or 0.0) / 1000.0
    return min(config.call_timeout_s, max(config.gpu_work_timeout_s, config.gpu_work_eager_factor * eager_s))


def gpu_arch() -> str | None:
    """The first GPU's compute capability as TORCH_CUDA_ARCH_LIST wants it ("9.0"), read by nvidia-smi."""
    return _nvidia_smi("compute_cap")


def gpu_name() -> str:
    return _nvidia_smi("name") or "unknown-gpu"


def _nvidia_smi(field_name: str) -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={field_name}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
        return out.splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def _device_memory(device: str) -> int:
    """Bytes of the device's memory (the host's on a CPU), for the reference process's budget."""
    if device == "cuda":
        total = _nvidia_smi("memory.total")  # "143771 MiB"
        try:
            return int(str(total).split()[0]) * 1024**2
        except (ValueError, IndexError):
            return 16 * 1024**3
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 8 * 1024**3


MIN_FILE_CAP = 1024**3
SHARE_ROOT = Path("/dev/shm")  # CPU outputs go through memory-backed files


class Oracle:
    """Evaluates candidates for tasks on one device. Thread-safe: builds and checks run beside each other."""

    def __init__(self, config: OracleConfig | None = None) -> None:
        self.config = c = config or OracleConfig()
        # Seconds of this start by step: a cold run's first build waits for it (`OracleActor.stats`).
        self.init_s: dict[str, float] = {}
        mark = time.perf_counter()

        def step(name: str) -> None:
            nonlocal mark
            now = time.perf_counter()
            self.init_s[name] = round(now - mark, 3)
            mark = now

        self.gpu_arch = gpu_arch() if c.device == "cuda" else None
        self.device_name = gpu_name() if c.device == "cuda" else "cpu"
        step("gpu query")
        # Fixed here, not inherited: a Ray actor's OMP_NUM_THREADS=1 would otherwise time CPU baselines
        # single-threaded in one run and multi-threaded in the next, under one cache key.
        self.threads = c.threads or os.cpu_count() or 1
        builds_root = cache_root(c.cache_dir)
        self.cores = plan_cores() if c.reserves_cores else None
        kept = self.cores is not None and self.cores.reserved
        self.quiet = QuietDevice(c.device, c.stop_builds_while_timing, gpu_lock.for_device(c.device, c.cache_dir),
                                 self.cores.for_builds if kept else None,
                                 # on a GPU the timing thread only launches; a CPU timing needs every core
                                 self.cores.for_timing if kept and c.device == "cuda" else None)
        self.pch = (c.pch_dir or default_root()) if c.precompiled_headers else None
        self.builds = CandidateBuilds(builds_root, self.gpu_arch, self.pch, c.build_timeout_s, self.quiet)
        # CUDA candidates mostly keep load_inline's default C++ flags: the header their bindings compile
        # against, precompiled now (the lite binding header where this torch allows it, else torch/extension.h)
        if c.device == "cuda":
            self.builds.request_default_header(with_cuda=True, header=LITE_BINDING if lite_binding_available() else FULL_PCH)
        step("builds and header")
        self.memory = MemoryBudget(int(c.candidate_memory * _device_memory(c.device)))
        self.worker_peaks = MeasuredPeaks()  # per task (its reference key): the most a worker was measured to hold
        self.compile_memory = MemoryBudget(int(c.compile_memory * _device_memory(c.device)), in_order=True)
        step("device memory")
        settings = ReferenceSettings(
            device=c.device, device_name=self.device_name, threads=self.threads, check_seeds=c.check_seeds,
            extra_size_seed=c.extra_size_seed, timing_seeds=c.timing_seeds, init_seed=c.init_seed, timing=c.timing,
            wants_compile=c.wants_compile, call_timeout_s=c.call_timeout_s, time_timeout_s=c.time_timeout_s,
            compile_timeout_s=c.compile_timeout_s, budget_bytes=int(c.reference_memory * _device_memory(c.device)),
            float64_max_bytes=int(c.float64_max_mb * 1024**2),
            compile_workers=c.compile_workers or max(1, min(4, (os.cpu_count() or 1) // 4)),
            compile_workers_idle=c.compile_workers_idle or max(1, min(8, (os.cpu_count() or 1) // 2)))
        self.references = References(settings, builds_root.parent / "baselines", alone=self.quiet.alone,
                                     shared=lambda: self.quiet.lock.shared(), register=self.quiet.running,
                                     reserve=self.compile_memory.reserve)
        self.device_s: dict[str, float] = {"reference": 0.0, "baselines": 0.0, "checks": 0.0, "timing": 0.0}
        self.standby = StandbyWorkers(c.device, c.device_slots if c.standby_workers is None else c.standby_workers,
                                      self.quiet.running)
        step("references and standby")

    def start_ahead(self) -> threading.Thread:
        """Start, in a thread, what the first candidates would otherwise wait for: the workers' fork server
        (started with the first build, that build waited for its imports: seconds of torch on a host whose
        torch has no bytecode), the reference process and the standby workers. For an oracle that will judge
        candidates (the Ray actor), not one made to look."""
        def start() -> None:
            try:
                start_fork_server()
                self.references.process.start()
                self.standby.fill()
            except Exception as exc:  # noqa: BLE001 - each is started again when first needed
                print(f"kernelsearch: starting the oracle's workers ahead failed ({exc}); they start when needed",
                      file=sys.stderr)

        thread = threading.Thread(target=start, daemon=True, name="start ahead")
        thread.start()
        return thread

    def builds_idle(self, idle: bool) -> None:
        """While no candidate is being built or waits to be, the torch.compile baselines may use the free
        cores (`References.cores_idle`) and the candidates' unpromised memory (`MemoryBudget.lend_from`)."""
        self.references.cores_idle(idle)
        self.compile_memory.lend_from(self.memory if idle else None)

    def alone(self, own: Worker | None = None, label: str = "timing"):
        return self.quiet.alone(own, label)

    def close(self) -> None:
        self.standby.close()
        self.references.close()

    # ------------------------------------------------------------ the whole way

    def evaluate(self, task: Task, text: str, backend: str = "auto") -> Verdict:
        candidate = self.extract(task, text, backend)
        if isinstance(candidate, Verdict):
            return candidate
        build = self.build(candidate)
        verdict = self.check_and_time(task, candidate, build)
        return self.add_compile_baseline(task, verdict)

    def extract(self, task: Task, text: str, backend: str = "auto") -> Candidate | Verdict:
        return candidate_from_completion(task, text, backend, self.config.device)

    # ------------------------------------------------------------ build slot

    def build(self, candidate: Candidate) -> BuildOutcome:
        """Compile the candidate's extensions into the cache (CPU only); nothing of it runs on the device."""
        refused = self._refused(candidate)
        if refused:
            key = build_key(candidate.source, candidate.backend, self.gpu_arch)
            return BuildOutcome(key, self.builds.root / "candidates" / key, False, False, 0.0, *refused)
        return self.builds.build(candidate.source, candidate.backend)

    def _refused(self, candidate: Candidate) -> tuple[str, str] | None:
        """A candidate this oracle will not run: the model's fault (`rejected`), or this machine's (`unsupported`)."""
        if candidate.backend == "torch" and not self.config.allow_torch:
            return "rejected", ("the code only uses PyTorch operators: write a custom kernel (CUDA through load_inline, "
                                "or Triton); plain PyTorch rewrites are accepted only with --allow-torch")
        if candidate.backend == "cuda" and self.config.device != "cuda":
            return "unsupported", "this oracle runs on the CPU: CUDA candidates need a GPU oracle (--device cuda)"
        if candidate.backend == "triton" and importlib.util.find_spec("triton") is None:
            return "unsupported", "Triton is not installed here (pip install triton): triton candidates cannot run"
        return None

    # ------------------------------------------------------------ device slot

    def check_and_time(self, task: Task, candidate: Candidate, build: BuildOutcome,
                       quiet: Callable[[], ContextManager] | None = None, fresh_baseline: bool = False) -> Verdict:
        """Check, then time. Several threads may check candidates at once (the device lock's shared side);
        timing holds the device alone, with the other candidates' workers stopped. `quiet`: a context manager
        held while anything is timed, for example to pause a generator that shares the GPU.
        `fresh_baseline`: time eager PyTorch again first, for the re-timing of a best kernel."""
        base: dict[str, Any] = dict(backend=candidate.backend, hash=candidate.hash, build_s=build.build_s,
                                    build_cached=build.cached, build_pch=build.pch_used, build_header=build.cuda_header,
                                    build_binding_header=build.binding_header)
        if build.status:
            return self._verdict(task, build.status, build.message, **base)
        quiet = quiet or contextlib.nullcontext
        self.standby.fill()  # from the first candidate on, the next ones find their worker started
        spent: dict[str, float] = {}
        pin_asked = time.perf_counter()
        with self.references.pinned(task):  # its reference stays in the reference process until the verdict
            asked = time.perf_counter()
            try:
                reference = (self.references.retime_eager if fresh_baseline else self.references.get)(task, quiet, spent)
            except ReferenceError as exc:
                return self._verdict(task, "runtime_error", f"the reference failed, not the candidate: {exc}", **base)
            # what the call took beyond its own work: the task's reference being made by another thread
            waited = max(0.0, time.perf_counter() - asked - sum(spent.values()))
            base["device_s"] = spent
            run = _CandidateRun(self, task, candidate, reference, base)
            try:
                verdict = run.judged(quiet)
            finally:
                run.close()
        verdict.queued_s["reference"] = round(waited, 4)
        # room in the reference process's memory beside the tasks of the candidates being judged
        verdict.queued_s["reference_memory"] = round(asked - pin_asked, 4)
        for phase, seconds in (verdict.device_s or {}).items():
            self.device_s[phase] = self.device_s.get(phase, 0.0) + seconds
        return verdict

    def prepare_task(self, task: Task, quiet: Callable[[], ContextManager] | None = None) -> None:
        """Make the task's reference now, time eager and start its `torch.compile` baseline, while its first
        candidate builds: the first check then finds them ready, and the compile baseline (CPU work beside the
        builds) starts a build's time earlier. Their device seconds count in the oracle's totals; a task whose
        own code fails is left for its candidate's check to report."""
        spent: dict[str, float] = {}
        try:
            with self.references.pinned(task):
                self.references.get(task, quiet or contextlib.nullcontext, spent)
        except ReferenceError:  # its own code failed, or the oracle closed meanwhile
            return
        for phase, seconds in spent.items():
            self.device_s[phase] = self.device_s.get(phase, 0.0) + seconds

    def add_compile_baseline(self, task: Task, verdict: Verdict, timeout_s: float | None = None) -> Verdict:
        """The verdict with its `torch.compile` speedup, once that baseline is measured (it is measured in
        the background, off the device's critical path; the wait for it holds no device slot)."""
        pending = self.compile_baseline_pending(task, verdict)
        if pending is None:
            return verdict
        timeout = self.compile_wait_s if timeout_s is None else timeout_s
        try:
            found = pending.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            found = not_measured(timeout)
        return self.with_compile_baseline(verdict, found)

    @property
    def compile_wait_s(self) -> float:
        """How long a correct verdict waits for its task's torch.compile baseline (compiling, then timing)."""
        return self.config.compile_timeout_s * 2

    def compile_baseline_pending(self, task: Task, verdict: Verdict) -> concurrent.futures.Future | None:
        """What a correct verdict waits for before its `torch.compile` speedup is known (None: nothing), as a
        future, so that an event loop can await it without a thread held for the wait."""
        if verdict.status != "correct" or not self.config.wants_compile:
            return None
        return self.references.compile_future(task)

    @staticmethod
    def with_compile_baseline(verdict: Verdict, found: dict[str, Any] | None) -> Verdict:
        found = found or {}
        fields = judge.with_compile_baseline(verdict.to_json(), found.get("compile"), found.get("compile_error"))
        return Verdict.from_json(fields)

    def _verdict(self, task: Task, status: str, message: str, **fields: Any) -> Verdict:
        return Verdict(task=task.id, status=status, message=message, device=self.config.device, sizes=dict(task.sizes),
                       tolerance=self.config.tolerance, **fields)


def not_measured(timeout_s: float) -> dict[str, str]:
    """The torch.compile baseline a verdict waited for in vain."""
    return {"compile_error": f"not measured within {timeout_s:.0f} s"}


def candidate_worker_bytes(prepared: Prepared, timing_sets: int) -> int:
    """Device bytes a candidate's worker may hold at once. Its model's parameters twice: the reference's
    copied into the candidate's, then the candidate's and the snapshot that catches a forward changing
    them. While checked, the inputs, their snapshot and the outputs; while timed, every timing input set,
    the outputs it keeps to catch reuse (one more than the sets), the sampled ones (one a set for the timed
    calls, one for the clocked block) and the call's own. Where the reference process measured the call
    (`Prepared.working_bytes`, on a GPU), its intermediates too: the first worker of `level2/59` (a 4.3 GB
    weight) held 23.7 GB on an H100 against 304 MB promised from inputs and outputs alone (this promises
    about 8.6 GB; what it still misses, `MeasuredPeaks` adds for the task's later workers)."""
    p = prepared
    own = 2 * p.param_bytes + max(p.working_bytes - p.input_bytes - p.output_bytes, 0)
    checks = 3 * p.input_bytes + 3 * p.output_bytes
    timing = timing_sets * p.input_bytes + (3 * timing_sets + 3) * p.output_bytes
    return own + max(checks, timing)


class _CandidateRun:
    """One candidate's worker, driven through its checks and its timing; its outputs go to the trusted
    reference process, which compares them with the task's reference."""

    def __init__(self, oracle: Oracle, task: Task, candidate: Candidate, reference: Reference, base: dict[str, Any]) -> None:
        self.oracle, self.task, self.candidate, self.reference, self.base = oracle, task, candidate, reference, base
        self.worker: Worker | None = None
        self.session: int | None = None
        self.share_dir: Path | None = None
        self.compared: list[tuple[str, int]] = []
        # Tolerance policies (docs/oracle.md, "Tolerance policies"): those every comparison so far passed,
        # the worst error figures, and the first failure under the run's own policy (judging goes on
        # through the checks while another policy still passes, so the verdict can say which ones do).
        self.passes: set[str] = set(POLICIES)
        self.errors: ErrorFigures | None = None
        self.failed: str | None = None
        self.spent = _Spent({})
        self.segments: _Segments | None = None
        self.block: int | None = None  # calls in the block this process clocks, once the worker's timing ended
        self.promised = 0  # device bytes the worker was promised (`MemoryBudget`)

    def _block_size(self, measured: Any) -> int:
        """Calls in the clocked block: enough for about 20 ms at the faster of eager and the candidate's own
        reported time. The report is the candidate's, so it can only shorten the block, never its check: a
        candidate that claims less than it takes gets a longer block (at most eager's), clocked here."""
        by_eager = self._eager_block()
        try:
            ms = float(measured)
        except (TypeError, ValueError):
            return by_eager
        if not ms > 0:
            return by_eager
        return min(by_eager, block_calls(ms, self.oracle.config.timing.wall_block(ms)))

    def _eager_block(self) -> int:
        median = (self.reference.eager or {}).get("median_ms")
        return block_calls(median, self.oracle.config.timing.wall_block(median or 0.0))

    def _verdict(self, status: str, message: str, **fields: Any) -> Verdict:
        verdict = self.oracle._verdict(self.task, status, message, **{**self.base, **fields})
        verdict.errors = self.errors
        if self.errors is not None and self.errors.float64 and FALLBACK_FLAG not in verdict.flags:
            verdict.flags = [*verdict.flags, FALLBACK_FLAG]
        return verdict

    def _passes(self) -> list[str]:
        return [p for p in POLICIES if p in self.passes]

    def judged(self, quiet: Callable[[], ContextManager]) -> Verdict:
        oracle, c = self.oracle, self.oracle.config
        if c.device == "cpu":
            self.share_dir = Path(tempfile.mkdtemp(prefix="ks-share-", dir=_share_root(self.reference.prepared.output_bytes)))
        job = self._job()
        # On a CPU, Triton kernels run under its interpreter (slow, but the same kernel code).
        env = {"TRITON_INTERPRET": "1"} if self.candidate.backend == "triton" and c.device == "cpu" else None
        device_s = dict(self.base.get("device_s") or {})
        self.base["device_s"] = device_s
        self.spent = _Spent(device_s)
        t0 = time.perf_counter()
        try:
            self.promised = self._memory_estimate()
            with oracle.memory.reserve(self.promised):
                self.spent.waited(t0)
                return self._checked_and_timed(job, env, device_s, t0, quiet)
        except ReferenceError as exc:
            return self._verdict("runtime_error", f"the oracle could not compare the outputs: {exc}",
                                 verify_s=time.perf_counter() - t0)

    def _memory_estimate(self) -> int:
        """Device bytes the worker is promised (`candidate_worker_bytes`), or what a worker of the task was
        measured to hold where that is more (its kernel's own buffers, the allocator's rounding)."""
        formula = candidate_worker_bytes(self.reference.prepared, len(self.reference.timing_seeds))
        return self.oracle.worker_peaks.promise(self.reference.key, formula)

    def _checked_and_timed(self, job: CandidateJob, env, device_s: dict[str, float], t0: float,
                           quiet: Callable[[], ContextManager]) -> Verdict:
        oracle = self.oracle
        try:
            self.session = oracle.references.open(self.task, self.reference, quiet)
            # The checks hold the device lock's shared side only while the worker or the trusted side has
            # device work in flight (`_Segments`): between two calls the worker waits, synchronised, for
            # `go`, and a timing waiting for the device goes first instead of waiting for every check to end.
            self.segments = _Segments(oracle.quiet.lock, self.spent)
            with self.segments:
                self.worker = oracle.standby.take(job.to_json(), {"candidate.py": self.candidate.source}, env=env)
                with oracle.quiet.running(self.worker):
                    checked = self._until("checked")
            verify_s = time.perf_counter() - t0
            self.spent.phase_done("checks", verify_s)
            if isinstance(checked, Verdict):
                return Verdict.from_json({**checked.to_json(), "verify_s": verify_s})
            if self.compared != self._expected_checks():
                return self._verdict("runtime_error", "the candidate's process skipped a correctness check "
                                     "(it must not write to the oracle's pipe)", verify_s=verify_s)
            own = judge.own_kernel_problem(self.candidate.backend, self.candidate.source, checked, self.reference.ops)
            if own:
                return self._verdict("rejected", own, verify_s=verify_s)
            if self.failed is not None:  # wrong under the run's policy, right under another: not timed
                return self._verdict("incorrect", self.failed, verify_s=verify_s, passes=self._passes())
            t1 = time.perf_counter()
            with oracle.quiet.running(self.worker), oracle.quiet.alone(self.worker, "candidate timing"), quiet():
                self.spent.waited(t1)
                self.segments = None  # the device is held alone until the result
                self.worker.send(cmd="time")
                ended = self._until("result")
            time_s = time.perf_counter() - t1
            self.spent.phase_done("timing", time_s)
        except PhaseTimeout as exc:
            return self._verdict("timeout", f"{exc} took longer than its limit (infinite loop or a hang?)",
                                 verify_s=time.perf_counter() - t0)
        except WorkerDied as exc:
            tail = self.worker.stderr_tail() if self.worker else ""
            return self._verdict("runtime_error", f"the candidate's process {exc}: {last_line(tail)}",
                                 verify_s=time.perf_counter() - t0)
        except ReferenceError as exc:
            return self._verdict("runtime_error", f"the oracle could not compare the outputs: {exc}",
                                 verify_s=time.perf_counter() - t0)
        if isinstance(ended, Verdict):
            return ended if ended.verify_s is not None else Verdict.from_json({**ended.to_json(), "verify_s": verify_s})
        result = ended
        if not isinstance(result, dict) or result.get("status") != "timed" or not isinstance(result.get("timing"), dict):
            return self._verdict(*judge.worker_failure(result), verify_s=verify_s)
        if not any(kind == "timed" for kind, _ in self.compared) or not any(kind == "block" for kind, _ in self.compared):
            return self._verdict("incorrect", "the outputs of the timed calls are missing", verify_s=verify_s)
        timing = dict(result["timing"])
        external = external_block(self.worker.clocks, self.block or 0)
        if external is None:
            return self._verdict("rejected", "the timing block the oracle clocks itself did not run", verify_s=verify_s)
        timing.update(external_ms=external.per_call_ms, external_drain_ms=external.drain_ms,
                      block_calls=self.block, block_rounds=external.rounds)
        flags = ["constant_reference"] if self.reference.prepared.constant else []  # e.g. a ReLU after a shift
        if checked.kernels_unseen:  # the own-kernel rule could not see the kernels (rule 14)
            flags.append(judge.KERNELS_UNSEEN_FLAG)
        fields = judge.score(timing, self.reference.eager, self.reference.prepared.floor, flags, checked.kernel_ms)
        fields.setdefault("timing", {})["worker_phases"] = {k: round(v, 4) for k, v in self.worker.phases.items()}
        fields["timing"]["profile_sessions"] = checked.profile_sessions
        if result["timing"].get("peak_mb") is not None:  # held at most, against what `MemoryBudget` promised it
            fields["timing"]["worker_memory_mb"] = {"peak": result["timing"]["peak_mb"],
                                                    "allocated": result["timing"].get("allocated_peak_mb"),
                                                    "promised": round(self.promised / 2**20)}
            self.oracle.worker_peaks.measured(self.reference.key, int(result["timing"]["peak_mb"]) * 2**20)
        passes = self._passes() if fields["status"] == "correct" else []
        return self._verdict(**fields, verify_s=verify_s, time_s=time_s, passes=passes)

    def _expected_checks(self) -> list[tuple[str, int]]:
        expected = [("check", i) for i in range(len(self.reference.cases))]
        if len(expected) > 1:
            expected.insert(2, ("after", 0))
        return expected

    def _until(self, wanted: str) -> Checked | dict | Verdict:
        """Serve the worker's shared outputs until it sends `wanted` (`checked` or `result`)."""
        assert self.worker is not None and self.session is not None
        for message in self.worker.messages():
            if "outputs" in message:
                try:
                    ready = OutputsReady.from_json(message["outputs"])
                except ValueError as exc:
                    return self._verdict("runtime_error", f"the candidate's process sent a malformed message ({exc})")
                expected = self._expected_checks()
                allowed = (expected[len(self.compared)] == (ready.kind, ready.index) if len(self.compared) < len(expected)
                           else False) if wanted == "checked" else ready.kind in ("timed", "block")
                if not allowed:
                    return self._verdict("runtime_error", "the candidate's process sent outputs it was not asked for "
                                         "(it must not write to the oracle's pipe)")
                asked = time.perf_counter()
                compared = self.oracle.references.compare(self.session, ready.kind, ready.index, ready.tensors,
                                                          str(self.share_dir) if self.share_dir else None,
                                                          self.oracle.config.tolerance)
                self.spent.compared(asked, compared.seconds)
                if compared.errors:
                    figures = ErrorFigures.from_json(compared.errors)
                    self.errors = figures if self.errors is None else self.errors.merged(figures)
                self.passes &= set(compared.passes)
                if not compared.ok and self.failed is None:
                    self.failed = compared.message
                # Checks go on while another policy still passes; a timed call's failure ends the run.
                if self.failed is not None and (wanted != "checked" or not self.passes):
                    return self._verdict("incorrect", self.failed, passes=self._passes())
                self.compared.append((ready.kind, ready.index))
                if self.segments is not None:
                    self.segments.between()  # the worker waits for `go`: a waiting timing may go first
                self.worker.send(cmd="go")
            elif "measured" in message and wanted == "result" and self.block is None:
                self.block = self._block_size(message["measured"])
                self.worker.send(cmd="block", calls=self.block, rounds=block_rounds(self.block, message["measured"]))
            elif "checked" in message and wanted == "checked":
                try:
                    return Checked.from_json(message["checked"])
                except ValueError as exc:
                    return self._verdict("runtime_error", f"the candidate's process sent a malformed message ({exc})")
            elif "result" in message:
                if wanted == "result":
                    return message["result"]
                return self._verdict(*judge.worker_failure(message["result"]))
        return self._verdict("runtime_error", "the worker ended early")  # pragma: no cover

    def _job(self) -> CandidateJob:
        oracle, c, ref = self.oracle, self.oracle.config, self.reference
        return CandidateJob(
            device=c.device, task_id=self.task.id, codes=ref.codes, init_seed=c.init_seed,
            cases=[case.to_json() for case in ref.cases], timing_seeds=ref.timing_seeds, timing=c.timing.__dict__,
            cache=str(oracle.builds.root), gpu_arch=oracle.gpu_arch, candidate_path="candidate.py",
            pch=str(oracle.pch) if oracle.pch else None, backend=self.candidate.backend,
            import_timeout_s=c.import_timeout_s, call_timeout_s=c.call_timeout_s, time_timeout_s=c.time_timeout_s,
            gpu_work_timeout_s=gpu_work_limit_s(c, ref.eager), threads=oracle.threads,
            # Per file (stderr, CPU output files): room for the outputs, not for filling the disk.
            max_file_bytes=max(MIN_FILE_CAP, 4 * ref.prepared.output_bytes),
            share_dir=str(self.share_dir) if self.share_dir else None)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
        if self.session is not None:
            self.oracle.references.close_session(self.session)
        if self.share_dir is not None:
            shutil.rmtree(self.share_dir, ignore_errors=True)


class _Spent:
    """Where a candidate's seconds in its device slot went (`Verdict.device_s`): `waiting` (for device memory,
    the device lock, the reference process's other requests), `compare` (the trusted side comparing its
    outputs), and the rest of its `checks` and its `timing` (the worker's own work). The four add up to
    its verify and timing seconds; `reference` and `baselines` are the task's, counted by `References.get`."""

    def __init__(self, device_s: dict[str, float]) -> None:
        self.device_s = device_s
        self._waiting = 0.0  # within the phase under way
        self._compare = 0.0

    def waited(self, since: float) -> None:
        self._waiting += time.perf_counter() - since

    def compared(self, asked: float, seconds: float) -> None:
        """A comparison asked at `asked` that the reference process spent `seconds` on."""
        round_trip = time.perf_counter() - asked
        self._compare += min(seconds, round_trip)
        self._waiting += max(0.0, round_trip - seconds)

    def phase_done(self, phase: str, seconds: float) -> None:
        for name, value in (("waiting", self._waiting), ("compare", self._compare)):
            if value:
                self.device_s[name] = self.device_s.get(name, 0.0) + value
        self.device_s[phase] = max(0.0, seconds - self._waiting - self._compare)
        self._waiting = self._compare = 0.0


class _Segments:
    """The device lock's shared side for a candidate being checked, held while its worker or the trusted side
    may have device work in flight and let go between two calls, when the worker waits (synchronised) for
    `go`: a timing waits for the current call of each check, not for every check to end."""

    def __init__(self, lock, spent: _Spent) -> None:
        self.lock, self.spent = lock, spent
        self._held: contextlib.ExitStack | None = None

    def _take(self) -> None:
        asked = time.perf_counter()
        stack = contextlib.ExitStack()
        stack.enter_context(self.lock.shared())
        self._held = stack
        self.spent.waited(asked)

    def _let_go(self) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            held.close()

    def between(self) -> None:
        self._let_go()
        self._take()

    def __enter__(self) -> "_Segments":
        self._take()
        return self

    def __exit__(self, *exc: object) -> None:
        self._let_go()


def _share_root(output_bytes: int) -> Path | None:
    """Where a CPU worker writes its outputs for the trusted side: memory-backed `/dev/shm` when it has room
    for a check's outputs several times over (a container's may be 64 MB), else the temporary folder."""
    try:
        if SHARE_ROOT.is_dir() and shutil.disk_usage(SHARE_ROOT).free > 8 * output_bytes + 256 * 1024**2:
            return SHARE_ROOT
    except OSError:
        pass
    return None


@dataclass
class ClockedBlock:
    """The block of calls this process clocked around the worker's messages, its fastest round."""

    per_call_ms: float
    drain_ms: float | None  # how long the worker's final synchronise took after its `block_issued` mark
    rounds: int  # rounds that ran to their end


def external_block(clocks: dict[str, float], calls: int) -> ClockedBlock | None:
    """The worker's clocked block by this process's clock, from the marks its rounds sent (None: no round
    ran to its end). A round without a `block_issued` mark between its start and end has no drain."""
    rounds = []
    for r in range(WALL_ROUNDS):
        start, issued, end = (clocks.get(f"block_{mark} {r}") for mark in ("start", "issued", "end"))
        if start is not None and end is not None:
            drain = max(0.0, end - issued) * 1e3 if issued is not None and start <= issued <= end else None
            rounds.append((max(0.0, end - start) * 1e3, drain))
    if not rounds or calls <= 0:
        return None
    total, drain = min(rounds, key=lambda r: r[0])
    return ClockedBlock(total / calls, drain, len(rounds))
