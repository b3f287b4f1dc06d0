"""The oracle: extract, build, check and time one candidate against a task, and give the verdict.

The work is split the way the search schedules it: `build` needs only CPU (a build slot), `check_and_time`
needs the device (the timing slot). `evaluate` does both in turn. Reference outputs and baseline timings
are computed by trusted code in a worker of their own, held in this process's memory (outputs) and
cached on disk (timings, per task, device and torch version).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager

import torch

from oracle import harness
from oracle.build import build_key, cache_root
from oracle.candidate import Candidate
from oracle.compare import compare
from oracle.device_lock import DeviceLock
from oracle.extract import extract
from oracle.pch import PchSpec, default_root, request_header
from oracle.sandbox import PhaseTimeout, Worker, WorkerDied, WorkerOutcome, run_to_result, signal_trees
from oracle.timing import TimingParams, block_calls
from oracle.verdict import Verdict
from tasks.fitting import shrink_once
from tasks.model import Task

# Operators that move or shape data but compute nothing: calling them is not a fallback (rule 11).
NON_COMPUTE_OPS = {
    f"aten::{n}" for n in (
        "empty empty_like empty_strided zeros zeros_like ones ones_like full full_like to _to_copy copy_ "
        "contiguous clone detach view reshape _reshape_alias _unsafe_view as_strided expand permute transpose t "
        "unsqueeze squeeze flatten select slice narrow split chunk unbind resize_ lift_fresh alias item "
        "_local_scalar_dense is_nonzero result_type new_empty new_zeros fill_ zero_ set_ stride size numel "
        "dropout feature_dropout lift lift_fresh_copy"
    ).split()
}


@dataclass
class OracleConfig:
    device: str = "cpu"
    allow_torch: bool = False  # accept plain-PyTorch rewrites (studies of PyTorch-level rewrites)
    check_seeds: tuple[int, ...] = (11, 12, 13, 14, 15)  # rule 8: at least 5 fresh seeds at the task's size
    extra_size_seed: int = 21  # and one at a smaller size, where the task allows it
    timing_seeds: tuple[int, ...] = (101, 102, 103, 104)  # the rotating input sets
    init_seed: int = 42
    timing: TimingParams = field(default_factory=TimingParams)
    compile_baseline: bool | None = None  # None: on cuda only (torch.compile on a CPU takes minutes a task)
    build_timeout_s: float = 900.0
    import_timeout_s: float = 300.0
    call_timeout_s: float = 60.0
    time_timeout_s: float = 300.0
    compile_timeout_s: float = 600.0
    cache_dir: Path | None = None
    threads: int | None = None  # torch threads in workers (default: every core, the same for candidate and baselines)
    precompiled_headers: bool = True  # build C++ halves against a precompiled torch/extension.h (oracle.pch)
    stop_builds_while_timing: bool = True  # on a CPU: compilers share the cores being timed
    pch_dir: Path | None = None  # where those headers live (default: oracle.pch.default_root())

    check_slots: int | None = None  # candidates checked at once on the device (default: 4 on a GPU, 1 on a CPU)

    @property
    def device_slots(self) -> int:
        """On a CPU the checks would compete for the cores that time: one candidate at a time there."""
        return self.check_slots or (4 if self.device == "cuda" else 1)

    @property
    def wants_compile(self) -> bool:
        return self.device == "cuda" if self.compile_baseline is None else self.compile_baseline


@dataclass
class BuildOutcome:
    key: str
    key_dir: Path
    ok: bool
    cached: bool
    build_s: float
    status: str | None = None  # a final verdict status when the build decided it (compile_error, timeout)
    message: str = ""
    pch_used: bool = False  # the C++ half used a precompiled header
    light_include: bool | None = None  # CUDA sources built against torch/types.h (None: not applicable)


@dataclass
class Reference:
    outputs: list[list[torch.Tensor | None]]  # per check case
    ops: list[str]
    eager: dict[str, Any] | None
    compile: dict[str, Any] | None
    compile_error: str | None = None
    codes: list[str] = field(default_factory=list)
    timing_outputs: list[list[torch.Tensor | None]] = field(default_factory=list)  # per timing input set
    floor: dict[str, Any] | None = None  # flops, bytes, dtype, sol_ms (oracle.floor)

    @property
    def constant(self) -> bool:
        """Every check's reference output is one repeated value: the check cannot tell much apart."""
        return all(t is None or t.numel() < 2 or bool((t == t.flatten()[0]).all()) for outs in self.outputs for t in outs)


def gpu_arch() -> str | None:
    """The first GPU's compute capability as TORCH_CUDA_ARCH_LIST wants it ("9.0"), read by nvidia-smi."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap,name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
        return out.splitlines()[0].split(",")[0].strip()
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def gpu_name() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
        return out.splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown-gpu"


class Oracle:
    """Evaluates candidates for tasks on one device. Thread-safe: builds may run beside a timing call."""

    def __init__(self, config: OracleConfig | None = None) -> None:
        self.config = config or OracleConfig()
        self.gpu_arch = gpu_arch() if self.config.device == "cuda" else None
        self.device_name = gpu_name() if self.config.device == "cuda" else "cpu"
        # Fixed here, not inherited: a Ray actor's OMP_NUM_THREADS=1 would otherwise time CPU baselines
        # single-threaded in one run and multi-threaded in the next, under one cache key.
        self.threads = self.config.threads or os.cpu_count() or 1
        self.builds = cache_root(self.config.cache_dir)
        self.pch = (self.config.pch_dir or default_root()) if self.config.precompiled_headers else None
        self.baselines = self.builds.parent / "baselines"
        self.baselines.mkdir(parents=True, exist_ok=True)
        self._references: OrderedDict[str, Reference] = OrderedDict()
        self._ref_lock = threading.Lock()
        self.device_lock = DeviceLock()
        self._workers: set[Worker] = set()  # candidate workers alive now (stopped while another is timed)
        # On a CPU the device is the cores a compiler uses too: builds and header makers are stopped while
        # something is timed, or a 20-second g++ beside a 2 ms kernel makes its time (and the choice of the
        # fastest kernel) noise.
        self._builders: set[Worker] = set()
        self._header_makers: list[subprocess.Popen] = []
        self._held_alone = False  # a timing holds the device now: a compiler starting meanwhile starts stopped
        self._stopped_late: list[int] = []  # pids of those
        self._workers_lock = threading.Lock()

    # ------------------------------------------------------------ the whole way

    def evaluate(self, task: Task, text: str, backend: str = "auto") -> Verdict:
        candidate = self.extract(task, text, backend)
        if isinstance(candidate, Verdict):
            return candidate
        build = self.build(candidate)
        return self.check_and_time(task, candidate, build)

    def extract(self, task: Task, text: str, backend: str = "auto") -> Candidate | Verdict:
        found = extract(text, backend)
        if found.source is None:
            return self._verdict(task, "no_code", found.reason)
        return Candidate.make(task.id, found.source, found.backend or "torch")

    # ------------------------------------------------------------ build slot

    def build(self, candidate: Candidate) -> BuildOutcome:
        """Compile the candidate's extensions into the cache (CPU only); nothing of it runs on the device."""
        key = build_key(candidate.source, candidate.backend, self.gpu_arch)
        key_dir = self.builds / "candidates" / key
        ok_file, failed_file = key_dir / "ok.json", key_dir / "failed.json"
        if ok_file.exists():
            return BuildOutcome(key, key_dir, True, True, 0.0)
        if failed_file.exists():
            data = json.loads(failed_file.read_text())
            return BuildOutcome(key, key_dir, False, True, 0.0, "compile_error", data["message"])
        reason = self._unsupported(candidate)
        if reason:
            return BuildOutcome(key, key_dir, False, False, 0.0, "rejected", reason)
        if candidate.backend not in ("cuda", "cpp"):
            return BuildOutcome(key, key_dir, True, False, 0.0)  # nothing to compile ahead of the run
        key_dir.mkdir(parents=True, exist_ok=True)
        job = {"cache": str(self.builds), "gpu_arch": self.gpu_arch, "candidate_path": "candidate.py",
               "pch": str(self.pch) if self.pch else None,
               "backend": candidate.backend, "build_timeout_s": self.config.build_timeout_s,
               "max_file_bytes": 2 * MIN_FILE_CAP}  # the extension's .so and the compiler's files fit
        # CUDA hidden: a build slot compiles only, the GPU stays with the timing slot.
        worker = Worker(harness.build_entry, job, {"candidate.py": candidate.source}, env={"CUDA_VISIBLE_DEVICES": ""})
        self._register_compiler(worker.process.pid, lambda: self._builders.add(worker))
        try:
            outcome = run_to_result(worker)
        finally:
            with self._workers_lock:
                self._builders.discard(worker)
        if outcome.timed_out_phase:
            return BuildOutcome(key, key_dir, False, False, outcome.elapsed_s, "timeout",
                                f"building took longer than {self.config.build_timeout_s:.0f} s")
        if outcome.result is None:
            return BuildOutcome(key, key_dir, False, False, outcome.elapsed_s, "runtime_error",
                                f"the build worker {outcome.crashed}: {_last_line(outcome.stderr_tail)}")
        r = outcome.result
        if self.pch is not None and r["error_kind"] is None:  # flags that built: worth a header
            for wanted in r.get("pch_wanted") or []:  # made beside the search, for the builds after this one
                maker = request_header(self.pch, PchSpec.from_json(wanted))
                if maker is not None:
                    self._register_compiler(maker.pid, lambda m=maker: self._header_makers.append(m))
        if r["error_kind"] == "compile":
            failed_file.write_text(json.dumps({"message": r["message"], "build_s": r["build_s"]}))
            return BuildOutcome(key, key_dir, False, False, r["build_s"], "compile_error", r["message"])
        if r["error_kind"] is None:
            ok_file.write_text(json.dumps({"build_s": r["build_s"], "extensions": r["extensions"],
                                           "pch_used": r.get("pch_used", False), "light_include": r.get("light_include")}))
        # An import error that is not the compiler's is left to the run, which imports with the device present.
        return BuildOutcome(key, key_dir, True, not r["compiled"], r["build_s"], pch_used=bool(r.get("pch_used")),
                            light_include=r.get("light_include"))

    def _unsupported(self, candidate: Candidate) -> str | None:
        if candidate.backend == "torch" and not self.config.allow_torch:
            return ("the code only uses PyTorch operators: write a custom kernel (CUDA through load_inline, "
                    "or Triton); plain PyTorch rewrites are accepted only with --allow-torch")
        if candidate.backend == "cuda" and self.config.device != "cuda":
            return "this oracle runs on the CPU: CUDA candidates need a GPU oracle (--device cuda)"
        if candidate.backend == "triton" and importlib.util.find_spec("triton") is None:
            return "Triton is not installed here: triton candidates cannot run"
        return None

    # ------------------------------------------------------------ timing slot

    def check_and_time(self, task: Task, candidate: Candidate, build: BuildOutcome,
                       quiet: Callable[[], ContextManager] | None = None, fresh_baseline: bool = False) -> Verdict:
        """Check, then time. Several threads may check candidates at once (the device lock's shared side);
        timing, and the baselines on their first use, hold the device alone (its exclusive side), with the
        other candidates' workers stopped. `quiet`: a context manager held while anything is timed, for
        example to pause a generator that shares the GPU. `fresh_baseline`: time eager PyTorch again first
        (`refresh_baselines`), for the re-timing of a best kernel."""
        base = dict(backend=candidate.backend, hash=candidate.hash, build_s=build.build_s, build_cached=build.cached)
        if build.status:
            return self._verdict(task, build.status, build.message, **base)
        quiet = quiet or contextlib.nullcontext
        try:
            if fresh_baseline:
                with self.alone(None), quiet():
                    self.refresh_baselines(task)
            if self.has_reference(task):
                reference = self.reference(task)
            else:
                with self.alone(None), quiet():
                    reference = self.reference(task)
        except ReferenceError as exc:
            return self._verdict(task, "runtime_error", f"the reference failed, not the candidate: {exc}", **base)
        job = self._job(task, reference, candidate, build)
        files = {"candidate.py": candidate.source}
        # On a CPU, Triton kernels run under its interpreter (slow, but the same kernel code).
        env = {"TRITON_INTERPRET": "1"} if candidate.backend == "triton" and self.config.device == "cpu" else None
        worker: Worker | None = None
        try:
            with self.device_lock.shared():
                t0 = time.perf_counter()
                worker = Worker(harness.candidate_entry, job, files, env=env)
                with self._workers_lock:
                    self._workers.add(worker)
                checked = self._run_checks(task, worker, base)
            if isinstance(checked, Verdict):
                return checked
            checked = self._judge_checks(task, worker, reference, candidate, checked, base)
            if isinstance(checked, Verdict):
                return checked
            verify_s = time.perf_counter() - t0
            with self.alone(worker), quiet():
                worker.send(cmd="time")
                outcome = run_to_result(worker, close=False)
            if outcome.timed_out_phase or outcome.result is None or outcome.result.get("status") != "timed":
                return self._failed_run(task, outcome, base, verify_s=verify_s)
            # The outputs of timed calls are checked too: a candidate right only while checked is caught.
            wrong = self._compare_timed_outputs(worker.dir, reference)
            if wrong:
                return self._verdict(task, "incorrect", wrong, verify_s=verify_s, **base)
        finally:
            if worker is not None:
                with self._workers_lock:
                    self._workers.discard(worker)
                worker.close()
        timing = dict(outcome.result["timing"])
        external = _external_ms(outcome.clocks, job["block_calls"])
        if external is None:
            return self._verdict(task, "rejected", "the timing block the oracle clocks itself did not run", verify_s=verify_s, **base)
        timing["external_ms"] = external
        return self._scored(task, timing, reference, base, checked["flags"], verify_s, outcome.elapsed_s)

    @contextlib.contextmanager
    def alone(self, own: Worker | None = None):
        """The device to this thread alone: no check runs, and every other candidate's worker is stopped
        (SIGSTOP) so that nothing it left running can launch work on the device meanwhile. On a CPU the
        compilers are stopped too (builds and header makers, with every process they started): they resume,
        a little later, once the timing is done."""
        with self.device_lock.exclusive():
            with self._workers_lock:
                others = [w.process.pid for w in self._workers if w is not own]
                if self._stops_compilers():
                    self._header_makers = [m for m in self._header_makers if m.poll() is None]
                    others += [w.process.pid for w in self._builders] + [m.pid for m in self._header_makers]
                    self._held_alone = True
                signal_trees(others, signal.SIGSTOP)
            try:
                yield
            finally:
                with self._workers_lock:
                    self._held_alone = False
                    signal_trees(others + self._stopped_late, signal.SIGCONT)
                    self._stopped_late = []

    def _stops_compilers(self) -> bool:
        return self.config.device == "cpu" and self.config.stop_builds_while_timing

    def _register_compiler(self, pid: int, add: Callable[[], None]) -> None:
        """Track a build worker or header maker that has just started; one that starts while a timing holds
        the device is stopped at once, and resumed with the others when the timing ends."""
        with self._workers_lock:
            add()
            if self._held_alone:
                signal_trees([pid], signal.SIGSTOP)
                self._stopped_late.append(pid)

    def _run_checks(self, task: Task, worker: Worker, base: dict) -> dict | Verdict:
        """Drive the worker through its checks; its `checked` report, or the verdict that ends the evaluation."""
        try:
            for message in worker.messages():
                if "result" in message:  # the worker stopped early: an error, a rejection
                    r = message["result"]
                    return self._verdict(task, *_worker_failure(r), **base)
                if "checked" in message:
                    return message["checked"]
            return self._verdict(task, "runtime_error", "the worker ended early", **base)  # pragma: no cover
        except PhaseTimeout as exc:
            return self._verdict(task, "timeout", f"{exc} took longer than its limit (infinite loop or a hang?)", **base)
        except WorkerDied as exc:
            return self._verdict(task, "runtime_error", f"the candidate's process {exc}: {_last_line(worker.stderr_tail())}", **base)

    def _judge_checks(self, task: Task, worker: Worker, reference: Reference, candidate: Candidate, checked: dict,
                      base: dict) -> dict | Verdict:
        """Compare the checked outputs with the reference's (here, in the trusted process) and apply rule 11."""
        wrong = self._compare_outputs(worker.dir, reference)
        if wrong:
            return self._verdict(task, "incorrect", wrong, **base)
        own = self._own_kernel_problem(candidate, checked, reference)
        if own:
            return self._verdict(task, "rejected", own, **base)
        return checked

    def _compare_outputs(self, job_dir: Path, reference: Reference) -> str | None:
        for i, ref_outs in enumerate(reference.outputs):
            try:
                outs = torch.load(job_dir / f"out_{i}.pt", weights_only=True)
            except Exception as exc:  # noqa: BLE001 - anything but plain tensors is refused by weights_only
                return f"the outputs of check {i} could not be read as plain tensors ({type(exc).__name__})"
            if len(outs) != len(ref_outs):
                return f"forward returned {len(outs)} output(s), expected {len(ref_outs)}"
            size_note = " (at the second, smaller size)" if i >= len(reference.outputs) - 1 and len(reference.codes) > 1 else ""
            for j, (out, ref) in enumerate(zip(outs, ref_outs)):
                label = f"output {j}" if len(ref_outs) > 1 else "output"
                result = compare(out, ref, label)
                if not result.ok:
                    return f"check {i + 1} of {len(reference.outputs)}{size_note}: {result.message}"
        after = job_dir / "out_0_after.pt"
        if after.exists():
            before = torch.load(job_dir / "out_0.pt", weights_only=True)
            later = torch.load(after, weights_only=True)
            if any(not torch.equal(a.nan_to_num(0), b.nan_to_num(0)) for a, b in zip(before, later) if a is not None and b is not None):
                return "a later call changed the tensor returned by an earlier call (reused output buffer); allocate a new output each call"
        return None

    def _compare_timed_outputs(self, job_dir: Path, reference: Reference) -> str | None:
        for prefix, when in (("timed", "a timed call"), ("block", "a call of the wall-clock block")):
            # A short timing may not reach every input set; each set that was run has one sampled output.
            present = [k for k in range(len(reference.timing_outputs)) if (job_dir / f"{prefix}_{k}.pt").exists()]
            if reference.timing_outputs and not present:
                return f"the outputs of {when} are missing"
            for k in present:
                ref_outs = reference.timing_outputs[k]
                path = job_dir / f"{prefix}_{k}.pt"
                try:
                    outs = torch.load(path, weights_only=True)
                except Exception as exc:  # noqa: BLE001
                    return f"the outputs of {when} could not be read as plain tensors ({type(exc).__name__})"
                if len(outs) != len(ref_outs):
                    return f"forward returned {len(outs)} output(s) in {when}, expected {len(ref_outs)}"
                for j, (out, ref) in enumerate(zip(outs, ref_outs)):
                    result = compare(out, ref, f"output {j}" if len(ref_outs) > 1 else "output")
                    if not result.ok:
                        return (f"correct while checked but wrong in {when} (input set {k + 1}): {result.message}; "
                                "the output must be right on every call")
        return None

    def _own_kernel_problem(self, candidate: Candidate, checked: dict, reference: Reference) -> str | None:
        """Rule 11: the candidate ran code of its own, and did not just call the operators it replaces."""
        if candidate.backend == "torch":
            return None  # only reachable with --allow-torch
        if checked["own_calls"] == 0:
            return "the custom kernel was never called: forward must call the compiled extension (or Triton kernel)"
        if candidate.backend == "cuda":
            names = set(re.findall(r"__global__\s+(?:void\s+)?(?:__launch_bounds__\([^)]*\)\s+)?(?:void\s+)?(\w+)", candidate.source))
            if names and not any(n in k for k in checked["kernels"] for n in names):
                return ("none of the candidate's __global__ kernels ran on the GPU "
                        f"({', '.join(sorted(names))}); its extension only called PyTorch operators")
        replaced = {op for op in reference.ops if op not in NON_COMPUTE_OPS}
        if replaced and replaced <= set(checked["ops"]):
            return ("the candidate still calls every PyTorch operator of the reference "
                    f"({', '.join(sorted(replaced))}): replace them with the custom kernel, do not fall back to PyTorch")
        return None

    def _failed_run(self, task: Task, outcome: WorkerOutcome, base: dict, verify_s: float) -> Verdict:
        if outcome.timed_out_phase:
            return self._verdict(task, "timeout", f"{outcome.timed_out_phase} took longer than its limit", verify_s=verify_s, **base)
        if outcome.result is None:
            return self._verdict(task, "runtime_error", f"the candidate's process {outcome.crashed} while being timed: "
                                 f"{_last_line(outcome.stderr_tail)}", verify_s=verify_s, **base)
        return self._verdict(task, *_worker_failure(outcome.result), verify_s=verify_s, **base)

    def _scored(self, task: Task, timing: dict, reference: Reference, base: dict, flags: list[str], verify_s: float, time_s: float) -> Verdict:
        flags = list(flags)
        if reference.constant:
            flags.append("constant_reference")  # e.g. a ReLU after a negative shift: zeros pass
        time_ms = timing["median_ms"]
        eager = reference.eager or {}
        # Rule 14: events that miss work (side streams, threads) show as a wall clock far above them. The wall
        # clock is the larger of the worker's own and the one this process measured around a block of calls
        # (a candidate can patch the clocks in its own process, not ours).
        wall_ms = max(timing["wall_ms"], timing.get("external_ms") or 0.0)
        eager_wall = max(eager.get("wall_ms", 0), eager.get("external_ms") or 0.0)
        ratio = wall_ms / time_ms if time_ms > 0 else float("inf")
        eager_ratio = eager_wall / eager["median_ms"] if eager.get("median_ms") else 1.0
        if ratio > max(1.5, 1.5 * eager_ratio) and wall_ms - time_ms > 0.05:
            flags.append("wall_clock_disagrees")
            time_ms = wall_ms
        # Rule 14: nothing is faster than the physical floor (bytes over bandwidth, FLOPs over peak).
        sol_ms = (reference.floor or {}).get("sol_ms")
        if sol_ms:
            fastest = time_ms  # the (flushed) median, or the wall clock where that disagreed
            if fastest < sol_ms:
                return self._verdict(
                    task, "rejected",
                    f"impossible: faster than the memory/compute floor ({fastest:.4g} ms < {sol_ms:.4g} ms for "
                    f"{reference.floor['bytes'] / 1e6:.4g} MB and {reference.floor['flops'] / 1e9:.4g} GFLOP); "
                    "the timing missed work or the work was skipped",
                    time_ms=time_ms, sol_ms=sol_ms, sol_fraction=sol_ms / fastest if fastest > 0 else None,
                    verify_s=verify_s, time_s=time_s, flags=flags + ["below_floor"],
                    timing={"candidate": timing, "sol_ms": sol_ms, "floor": reference.floor}, **base)
        eager_ms = eager.get("median_ms")
        compile_ms = (reference.compile or {}).get("median_ms")
        timing_info = {"candidate": timing, "eager": reference.eager, "compile": reference.compile}
        sol_fraction = sol_ms / time_ms if sol_ms and time_ms > 0 else None
        if sol_ms:
            timing_info.update(sol_ms=sol_ms, sol_fraction=sol_fraction, floor=reference.floor)
        if reference.compile_error:
            timing_info["compile_error"] = reference.compile_error
        speed = f"{time_ms:.4g} ms"
        sp_e = eager_ms / time_ms if eager_ms and time_ms > 0 else None
        sp_c = compile_ms / time_ms if compile_ms and time_ms > 0 else None
        if sp_e:
            speed += f", {sp_e:.2f}x eager PyTorch ({eager_ms:.4g} ms)"
        if sp_c:
            speed += f", {sp_c:.2f}x torch.compile ({compile_ms:.4g} ms)"
        return self._verdict(task, "correct", f"correct; {speed}", time_ms=time_ms, eager_ms=eager_ms, compile_ms=compile_ms,
                             speedup_vs_eager=sp_e, speedup_vs_compile=sp_c, verify_s=verify_s, time_s=time_s,
                             flags=flags, timing=timing_info, sol_ms=sol_ms, sol_fraction=sol_fraction, **base)

    # ------------------------------------------------------------ reference and baselines

    def _reference_key(self, task: Task) -> str:
        return hashlib.sha256(f"{task.code}\0{self.config.device}\0{self.config.check_seeds}\0{self.config.timing_seeds}".encode()).hexdigest()[:20]

    def has_reference(self, task: Task) -> bool:
        return self._reference_key(task) in self._references

    def reference(self, task: Task) -> Reference:
        """Reference outputs (memory) and baseline timings (disk cache) for a task on this device."""
        key = self._reference_key(task)
        with self._ref_lock:
            if key in self._references:
                self._references.move_to_end(key)
                return self._references[key]
            reference = self._compute_reference(task, key)
            self._references[key] = reference
            while len(self._references) > 8:
                self._references.popitem(last=False)
            return reference

    def refresh_baselines(self, task: Task) -> None:
        """Time eager PyTorch again, now, bypassing the disk cache (the `torch.compile` time is kept), so that
        a re-timed best kernel is compared with a baseline measured under the same conditions rather than
        whenever the cache was filled: on a shared CPU, load alone moves times by 2-3x between runs."""
        key = self._reference_key(task)
        with self._ref_lock:
            self._references[key] = self._compute_reference(task, key, retime_eager=True)

    def _compute_reference(self, task: Task, key: str, retime_eager: bool = False) -> Reference:
        codes = [task.code]
        smaller = shrink_once(task.code, task.id)
        if smaller:
            codes.append(smaller)
        baseline_file = self.baselines / f"{key}-{_slug(self.device_name)}-torch{torch.__version__}-t{self.threads}.json"
        cached = json.loads(baseline_file.read_text()) if baseline_file.exists() else None
        kept = cached if retime_eager else None  # its compile baseline survives the re-measure
        if retime_eager:
            cached = None
        job = {
            "device": self.config.device, "task_id": task.id, "codes": codes, "init_seed": self.config.init_seed,
            "cases": _cases(self.config, len(codes)), "timing_seeds": list(self.config.timing_seeds),
            "timing": self.config.timing.__dict__, "time": cached is None,
            "compile": self.config.wants_compile and not (kept and (kept.get("compile") or kept.get("compile_error"))),
            "call_timeout_s": self.config.call_timeout_s * 5, "time_timeout_s": self.config.time_timeout_s,
            "compile_timeout_s": self.config.compile_timeout_s, "threads": self.threads,
        }
        worker = Worker(harness.reference_entry, job)
        keep = worker.dir
        outcome = run_to_result(worker, close=False)
        try:
            if outcome.timed_out_phase:
                raise ReferenceError(f"{outcome.timed_out_phase} took too long")
            if outcome.result is None:
                raise ReferenceError(f"the reference worker {outcome.crashed}: {_last_line(outcome.stderr_tail)}")
            r = outcome.result
            if "error" in r:
                raise ReferenceError(r["error"])
            outputs = [torch.load(keep / f"ref_{i}.pt", weights_only=True) for i in range(len(job["cases"]))]
            timing_outputs = [torch.load(keep / f"tref_{k}.pt", weights_only=True) for k in range(len(job["timing_seeds"]))]
        finally:
            worker.close()
        if cached is None:
            eager = r.get("eager")
            if eager is not None:
                eager["external_ms"] = _external_ms(outcome.clocks, int(eager.get("block_calls") or 0))
            cached = {"eager": eager, "compile": r.get("compile"), "compile_error": r.get("compile_error"),
                      "device": self.device_name, "torch": torch.__version__, "task": task.id}
            if kept and not job["compile"]:
                cached.update(compile=kept.get("compile"), compile_error=kept.get("compile_error"))
            baseline_file.write_text(json.dumps(cached))
        return Reference(outputs, r["ops"], cached["eager"], cached.get("compile"), cached.get("compile_error"), codes,
                         timing_outputs=timing_outputs, floor=r.get("floor"))

    def _job(self, task: Task, reference: Reference, candidate: Candidate, build: BuildOutcome) -> dict[str, Any]:
        c = self.config
        return {
            "device": c.device, "task_id": task.id, "codes": reference.codes, "init_seed": c.init_seed,
            "cases": _cases(c, len(reference.codes)), "timing_seeds": list(c.timing_seeds), "timing": c.timing.__dict__,
            "cache": str(self.builds), "gpu_arch": self.gpu_arch, "candidate_path": "candidate.py",
            "pch": str(self.pch) if self.pch else None,
            "backend": candidate.backend, "import_timeout_s": c.import_timeout_s, "call_timeout_s": c.call_timeout_s,
            "time_timeout_s": c.time_timeout_s, "threads": self.threads,
            # Per file (stderr, output files): room for the outputs, not for filling the disk.
            "block_calls": block_calls((reference.eager or {}).get("median_ms"), c.timing.wall_calls),
            "max_file_bytes": max(MIN_FILE_CAP, 4 * max((_bytes(outs) for outs in reference.outputs), default=0)),
        }

    def _verdict(self, task: Task, status: str, message: str, **fields: Any) -> Verdict:
        return Verdict(task=task.id, status=status, message=message, device=self.config.device, sizes=dict(task.sizes), **fields)


class ReferenceError(Exception):
    """The task's own reference could not be computed on this device."""


def _cases(config: OracleConfig, n_codes: int) -> list[dict[str, int]]:
    cases = [{"code": 0, "seed": s} for s in config.check_seeds]
    if n_codes > 1:
        cases.append({"code": 1, "seed": config.extra_size_seed})
    return cases


MIN_FILE_CAP = 1024**3
# The only verdicts a worker may report itself; anything else in its result (a forged "correct") is a fault.
WORKER_STATUSES = {"runtime_error", "rejected", "incorrect", "compile_error"}


def _worker_failure(result: Any) -> tuple[str, str]:
    """The (status, message) of a worker's early or failed result, never better than a failure."""
    if not isinstance(result, dict) or result.get("status") not in WORKER_STATUSES:
        status = result.get("status") if isinstance(result, dict) else None
        return "runtime_error", f"the candidate's process sent an unexpected result ({str(status)[:40]!r}): it must not write to the oracle's pipe"
    return result["status"], str(result.get("message", ""))[:2000]


def _bytes(outputs: list[torch.Tensor | None]) -> int:
    return sum(t.numel() * t.element_size() for t in outputs if t is not None)


def _external_ms(clocks: dict[str, float], calls: int) -> float | None:
    """Per-call time of the worker's clocked block, by this process's clock (None: the block never ran)."""
    if "block_start" not in clocks or "block_end" not in clocks or calls <= 0:
        return None
    return max(0.0, clocks["block_end"] - clocks["block_start"]) * 1e3 / calls


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no output"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")
