"""The oracle on the CPU: every verdict status from a real candidate, the rules of docs/oracle.md that a CPU can show,
the build cache, and the caller surviving candidates that crash, hang or exit."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from oracle import Oracle, OracleConfig
from oracle.timing import TimingParams
from tasks import Selection, load_tasks

CANDIDATES = Path(__file__).parent / "candidates"
TASK_ID = "builtin/1_LeakyReLU_Scale"
pytestmark = pytest.mark.slow  # builds a C++ extension once (about a minute on 2 cores)


def text(name: str) -> str:
    return (CANDIDATES / f"leaky_{name}.py").read_text()


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kernelsearch-cache")


@pytest.fixture(scope="module")
def task():
    return load_tasks("builtin", Selection(task_ids=frozenset({TASK_ID})), 256).tasks[0]


@pytest.fixture(scope="module")
def oracle(cache) -> Iterator[Oracle]:
    fast = TimingParams(warmup_calls=2, min_calls=5, max_calls=20, target_s=0.2, wall_calls=5)
    o = Oracle(OracleConfig(device="cpu", cache_dir=cache, timing=fast, call_timeout_s=20))
    yield o
    o.close()


@pytest.fixture(scope="module")
def first_correct(oracle, task):
    """The first evaluation builds the shared extension; later candidates reuse it."""
    return oracle.evaluate(task, text("correct"))


def test_correct_candidate_is_timed_against_eager(first_correct):
    v = first_correct
    assert v.status == "correct", v.message
    assert v.backend == "cpp" and v.hash and v.build_s > 0 and not v.build_cached
    assert v.time_ms > 0 and v.eager_ms > 0 and v.speedup_vs_eager == pytest.approx(v.eager_ms / v.time_ms)
    assert v.compile_ms is None  # torch.compile baselines are a GPU affair by default
    assert v.timing["candidate"]["calls"] >= 5 and v.timing["candidate"]["wall_ms"] > 0
    assert v.sizes == {"batch_size": 4096, "dim": 1024}


def test_second_evaluation_builds_nothing(oracle, task, first_correct, cache):
    again = oracle.evaluate(task, text("correct"))
    assert again.status == "correct" and again.build_cached and again.build_s == 0
    assert again.hash == first_correct.hash
    # A new oracle (another run) finds the same build on disk.
    other = Oracle(OracleConfig(device="cpu", cache_dir=cache))
    assert other.build(other.extract(task, text("correct"))).cached


def test_fresh_baseline_replaces_a_skewed_cached_one(oracle, task, first_correct, cache):
    """A best kernel is re-timed against eager PyTorch timed again just before it, not against a cached
    baseline measured under other load: here the cached one is made 1000x too slow."""
    files = list((cache / "baselines").glob("*.json"))
    assert len(files) == 1
    data = json.loads(files[0].read_text())
    true_eager = data["eager"]["median_ms"]
    data["eager"]["median_ms"] = true_eager * 1000
    files[0].write_text(json.dumps(data))
    skewed = Oracle(OracleConfig(device="cpu", cache_dir=cache, timing=oracle.config.timing))
    candidate = skewed.extract(task, text("correct"))
    assert skewed.check_and_time(task, candidate, skewed.build(candidate)).eager_ms == pytest.approx(true_eager * 1000)
    fresh = skewed.check_and_time(task, candidate, skewed.build(candidate), fresh_baseline=True)
    assert fresh.status == "correct", fresh.message
    assert fresh.eager_ms < true_eager * 20  # measured now (a loaded machine may differ a few times, not 1000)
    assert json.loads(files[0].read_text())["eager"]["median_ms"] == pytest.approx(fresh.eager_ms)  # the cache too


def test_same_extension_in_other_python_is_not_rebuilt(oracle, task, first_correct):
    v = oracle.evaluate(task, text("wrong_slope"))
    assert v.build_s == 0.0 and v.build_cached


def test_incorrect_reports_first_mismatches(oracle, task, first_correct):
    v = oracle.evaluate(task, text("wrong_slope"))
    assert v.status == "incorrect"
    assert "elements wrong" in v.message and "expected" in v.message and "got" in v.message


def test_wrong_shape_is_incorrect(oracle, task, first_correct):
    v = oracle.evaluate(task, text("wrong_shape"))
    assert v.status == "incorrect" and "shape" in v.message


def test_second_size_catches_hard_coded_sizes(oracle, task, first_correct):
    v = oracle.evaluate(task, text("fixed_size"))
    assert v.status == "runtime_error" and "hard-coded size" in v.message


def test_compile_error_gives_compiler_lines_and_is_cached(oracle, task):
    v = oracle.evaluate(task, text("compile_error"))
    assert v.status == "compile_error" and "error" in v.message.lower()
    again = oracle.evaluate(task, text("compile_error"))
    assert again.status == "compile_error" and again.build_cached and again.message == v.message


@pytest.mark.parametrize(
    "name, status, words",
    [
        ("raises", "runtime_error", "float32"),
        ("segfault", "runtime_error", "SIGSEGV"),
        ("sys_exit", "runtime_error", "SystemExit"),
        ("import_exit", "runtime_error", "exited"),
        ("never_calls_kernel", "rejected", "never called"),
        ("torch_fallback", "rejected", "aten::leaky_relu"),
        ("returns_input", "rejected", "shares memory"),
        ("mutates_input", "rejected", "modified its input"),
        ("reused_output", "incorrect", "later call changed"),
        ("torch", "rejected", "--allow-torch"),
        ("subclass", "rejected", "plain torch.Tensor"),
    ],
)
def test_faults_get_their_verdict(oracle, task, first_correct, name, status, words):
    v = oracle.evaluate(task, text(name))
    assert v.status == status, v.message
    assert words in v.message


def test_hang_times_out_and_oracle_goes_on(oracle, task, cache, first_correct):
    quick = Oracle(OracleConfig(device="cpu", cache_dir=cache, call_timeout_s=3,
                                timing=TimingParams(min_calls=3, max_calls=5, target_s=0.1, wall_calls=3)))
    v = quick.evaluate(task, text("infinite_loop"))
    assert v.status == "timeout" and "call" in v.message
    assert oracle.evaluate(task, text("correct")).status == "correct"


def test_caller_survives_a_crash_and_goes_on(oracle, task, first_correct):
    assert oracle.evaluate(task, text("segfault")).status == "runtime_error"
    assert oracle.evaluate(task, text("correct")).status == "correct"


def test_allow_torch_accepts_pytorch_rewrites(task, cache):
    o = Oracle(OracleConfig(device="cpu", cache_dir=cache, allow_torch=True,
                            timing=TimingParams(min_calls=3, max_calls=5, target_s=0.1, wall_calls=3)))
    v = o.evaluate(task, text("torch"))
    assert v.status == "correct" and v.backend == "torch"


def test_no_code(oracle, task):
    v = oracle.evaluate(task, "I would write a CUDA kernel here, but I am not sure how.")
    assert v.status == "no_code" and v.message


def test_cuda_candidate_on_cpu_oracle_is_unsupported_without_building(oracle, task):
    """A kernel this machine cannot run is not the model's failure: `unsupported`, not `rejected`."""
    cuda = text("correct").replace('cpp_sources=CPP,', 'cpp_sources=CPP, cuda_sources="__global__ void k() {}",')
    v = oracle.evaluate(task, cuda)
    assert v.status == "unsupported" and "GPU" in v.message and not v.build_s


def test_worker_sees_no_secrets(oracle, task, first_correct, monkeypatch):
    monkeypatch.setenv("KS_TEST_API_TOKEN", "secret-value")
    probe = text("correct").replace(
        "    def forward(self, x):\n",
        "    def forward(self, x):\n        import os\n        assert 'KS_TEST_API_TOKEN' not in os.environ, 'secret leaked'\n",
    )
    v = oracle.evaluate(task, probe)
    assert v.status == "correct", v.message


def test_eval_cli_json(cache, first_correct):
    env = dict(os.environ, KERNELSEARCH_CACHE=str(cache))
    out = subprocess.run(
        [sys.executable, "-m", "search.cli", "eval", TASK_ID, str(CANDIDATES / "leaky_correct.py"), "--device", "cpu", "--json"],
        capture_output=True, text=True, env=env, timeout=600, cwd=Path(__file__).parent.parent,
    )
    assert out.returncode == 0, out.stderr
    verdict = json.loads(out.stdout.strip().splitlines()[-1])
    for key in ("task", "backend", "hash", "status", "message", "time_ms", "eager_ms", "compile_ms",
                "speedup_vs_eager", "speedup_vs_compile", "build_s", "flags"):
        assert key in verdict
    assert verdict["status"] == "correct" and verdict["build_s"] == 0


def test_a_candidate_may_use_the_tasks_module_level_constants(oracle, task, first_correct):
    """As in KernelBench, the task's constants (here `negative_slope` and `scale`) are defined for the
    candidate; the task's `Model` and functions are not."""
    uses = text("correct").replace("ext.leaky_scale(x.contiguous(), self.negative_slope, self.scale)",
                                   "ext.leaky_scale(x.contiguous(), negative_slope, scale)")
    assert uses != text("correct")
    v = oracle.evaluate(task, uses)
    assert v.status == "correct", v.message
    borrows = uses.replace("ext.leaky_scale(x.contiguous(), negative_slope, scale)", "Model(0.05, 1.75)(x)")
    v = oracle.evaluate(task, borrows)
    assert v.status == "runtime_error" and "NameError" in v.message and "Model" in v.message, v.message


def test_a_calls_gpu_work_limit_is_seconds_unless_eager_itself_is_slow():
    """A kernel that never ends is caught once its call's launches returned and the GPU work passed the
    limit: 10 s, or 100 times eager's call for a task whose eager call is slow, never past the call's."""
    from oracle.evaluate import gpu_work_limit_s

    c = OracleConfig(device="cuda")
    assert gpu_work_limit_s(c, {"median_ms": 0.05}) == 10.0
    assert gpu_work_limit_s(c, None) == 10.0  # no eager time (a reference that could not be timed)
    assert gpu_work_limit_s(c, {"median_ms": 24.0}) == 10.0  # a level-2 convolution: 10 s, not 24 s
    assert gpu_work_limit_s(c, {"median_ms": 250.0}) == pytest.approx(25.0)
    assert gpu_work_limit_s(c, {"median_ms": 4000.0}) == c.call_timeout_s
    assert gpu_work_limit_s(OracleConfig(device="cuda", call_timeout_s=5.0), {"median_ms": 0.05}) == 5.0


def test_a_task_prepared_beside_its_first_build_is_ready_for_its_first_check(cache, task, first_correct):
    """The oracle actor prepares a task (reference, eager timing, compile baseline) while the task's first
    candidate builds: the check then makes nothing, and the seconds count in the oracle's totals."""
    fast = TimingParams(warmup_calls=2, min_calls=5, max_calls=20, target_s=0.2, wall_calls=5)
    o = Oracle(OracleConfig(device="cpu", cache_dir=cache, timing=fast, call_timeout_s=20))
    try:
        o.prepare_task(task)
        made_s = o.device_s["reference"]
        v = o.evaluate(task, text("correct"))  # its build is cached: the check follows at once
    finally:
        o.close()
    assert v.status == "correct", v.message
    assert made_s > 0 and "reference" not in v.device_s and "baselines" not in v.device_s, v.device_s


def test_a_check_that_waits_for_its_tasks_reference_says_so(cache, task, first_correct, monkeypatch):
    """A check whose task's reference is being made by another thread (the actor's preparation beside the
    first build) waits for it, working on nothing: `queued_s["reference"]`, apart from its device seconds."""
    fast = TimingParams(warmup_calls=2, min_calls=5, max_calls=20, target_s=0.2, wall_calls=5)
    o = Oracle(OracleConfig(device="cpu", cache_dir=cache, timing=fast, call_timeout_s=20))
    made = o.references.get

    def slow_get(task, quiet, spent):
        time.sleep(0.5)  # the task lock held by another thread
        return made(task, quiet, spent)

    try:
        made(task)  # this oracle's reference process started and the task made: what is left is the wait
        monkeypatch.setattr(o.references, "get", slow_get)
        v = o.evaluate(task, text("correct"))
    finally:
        o.close()
    assert v.status == "correct", v.message
    assert 0.45 <= v.queued_s["reference"] < 3.0, v.queued_s


def test_a_check_that_waits_for_room_beside_other_tasks_references_says_so(cache, task, first_correct, monkeypatch):
    """A candidate whose task does not fit in the reference process's memory beside the tasks of the
    candidates being judged waits for them before its check (`oracle.reference.ResidentBudget`), holding
    its device slot: `queued_s["reference_memory"]` says how long, so a run shows where its slots went."""
    fast = TimingParams(warmup_calls=2, min_calls=5, max_calls=20, target_s=0.2, wall_calls=5)
    o = Oracle(OracleConfig(device="cpu", cache_dir=cache, timing=fast, call_timeout_s=20))
    budget, pin = o.references._resident, o.references.pinned
    held, asked, release = threading.Event(), threading.Event(), threading.Event()

    def other_task() -> None:  # a candidate of a task that fills the whole budget, done 0.6 s after ours asks
        with budget.pinned("another task", budget.total):
            held.set()
            asked.wait(30)
            time.sleep(0.6)
        release.set()

    def pinned(t):
        asked.set()
        return pin(t)

    try:
        o.references.get(task)
        threading.Thread(target=other_task, daemon=True).start()
        assert held.wait(10)
        monkeypatch.setattr(o.references, "pinned", pinned)
        v = o.evaluate(task, text("correct"))
    finally:
        asked.set()
        release.wait(10)
        o.close()
    assert v.status == "correct", v.message
    assert 0.55 <= v.queued_s["reference_memory"] < 10.0, v.queued_s


def test_a_compile_worker_is_promised_the_call_the_reference_process_measured():
    """On a GPU the reference process measures the task's call (`Prepared.working_bytes`, `param_bytes`):
    the compile worker's promises come from that, weights and intermediates included; without a measure
    (a CPU), from the inputs and outputs."""
    from oracle.protocol import Prepared
    from oracle.reference import COMPILE_WORKER_OVERHEAD_BYTES as OVERHEAD, compile_worker_bytes

    mb = 1 << 20
    guessed = Prepared(ops=[], kernels=[], floor=None, constant=False, output_bytes=100 * mb, input_bytes=100 * mb,
                       reference_s=0.0)
    assert compile_worker_bytes(guessed, 2) == (300 * mb + OVERHEAD, 800 * mb + OVERHEAD)
    # an elementwise task: one call takes its input and its output, nothing more
    elementwise = Prepared(**{**guessed.to_json(), "working_bytes": 200 * mb})
    assert compile_worker_bytes(elementwise, 2) == (200 * mb + OVERHEAD, 500 * mb + OVERHEAD)
    # a GEMM with a 4 GB weight and a large intermediate: both are promised
    gemm = Prepared(**{**guessed.to_json(), "param_bytes": 4096 * mb, "working_bytes": 900 * mb})
    compiling, timing = compile_worker_bytes(gemm, 2)
    assert compiling == (4096 + 900) * mb + OVERHEAD
    assert timing == (4096 + 2 * 100 + 800 + 2 * 100) * mb + OVERHEAD


def test_a_candidate_worker_is_promised_its_weights_and_the_measured_intermediates():
    """A candidate's worker holds its model's parameters twice (the candidate's and their snapshot) and,
    where the reference process measured the call, its intermediates: a task with a 4 GB weight is promised
    more than its inputs and outputs. Without a measure (a CPU), the inputs and outputs alone."""
    from oracle.evaluate import candidate_worker_bytes
    from oracle.protocol import Prepared

    mb = 1 << 20
    plain = Prepared(ops=[], kernels=[], floor=None, constant=False, output_bytes=10 * mb, input_bytes=100 * mb,
                     reference_s=0.0)
    # checks: 3 x (inputs + outputs) = 330 MB; timing with 2 sets: 2 x 100 + 9 x 10 = 290 MB
    assert candidate_worker_bytes(plain, 2) == 330 * mb
    # 8 sets: 800 + 27 x 10 = 1070 MB, more than the checks
    assert candidate_worker_bytes(plain, 8) == 1070 * mb
    gemm = Prepared(**{**plain.to_json(), "param_bytes": 4096 * mb, "working_bytes": 600 * mb})
    assert candidate_worker_bytes(gemm, 2) == 2 * 4096 * mb + (600 - 110) * mb + 330 * mb


@pytest.mark.slow
def test_a_compile_baseline_is_promised_memory_to_compile_then_to_be_timed(tmp_path, task):
    """The torch.compile worker starts inside its compile's memory promise, and its timing sets' room is
    promised only once it has compiled (`oracle.reference.compile_worker_bytes`), ahead of compiles waiting. The baseline is written to
    the disk cache with its phases, so that a run's tail can be read from it."""
    from oracle.reference import compile_worker_bytes

    fast = TimingParams(warmup_calls=2, min_calls=5, max_calls=20, target_s=0.2, wall_calls=5)
    o = Oracle(OracleConfig(device="cpu", cache_dir=tmp_path, timing=fast, call_timeout_s=20, compile_baseline=True))
    events: list[tuple[str, float]] = []  # what happened, and its size or (the worker) when it started
    reserve, register = o.references._reserve, o.references._register

    @contextlib.contextmanager
    def recorded_reserve(nbytes, ahead=False):
        with reserve(nbytes, ahead=ahead) as borrowed:
            events.append(("promised", nbytes))
            promised_at.append(time.perf_counter())
            lent.append(borrowed)
            asked_ahead.append(ahead)
            yield True  # as if borrowed from the candidates' share: the phases say so
            events.append(("given back", nbytes))

    def recorded_register(worker):
        events.append(("worker", worker.started))
        return register(worker)

    promised_at: list[float] = []
    lent: list[bool] = []
    asked_ahead: list[bool] = []

    o.references._reserve, o.references._register = recorded_reserve, recorded_register
    try:
        before = time.time()
        o.prepare_task(task)
        found = o.references.compile_future(task).result(timeout=600)
        cached = o.references._read_baselines(o.references.key(task))
        reference = o.references._known[o.references.key(task)]
    finally:
        o.close()
    assert "compile" in found, found
    compiling, timing = compile_worker_bytes(reference.prepared, len(o.references.timing_seeds(task)))
    assert compiling < timing
    assert [e[0] for e in events] == ["promised", "worker", "given back", "promised", "given back"], events
    assert events[0][1] == compiling and events[3][1] == timing
    assert events[1][1] >= promised_at[0]  # the worker started once its memory was promised
    phases = cached["compile_phases"]
    assert before <= phases["started_at"] <= time.time()
    assert phases["compile_s"] > 0 and phases["time_s"] > 0, phases
    assert {k for k in phases if k.endswith("_s")} == {"turn_s", "memory_s", "compile_s", "alone_wait_s", "time_s"}
    assert phases["compiling_bytes"] == compiling and phases["timing_bytes"] == timing
    assert lent == [False, False]  # both fit the compile share: nothing borrowed
    assert asked_ahead == [False, True]  # the compiled worker's timing goes before compiles still waiting
    assert phases["compile_borrowed"] is True and phases["timing_borrowed"] is True
    assert phases["compile_reserved_mb"] is None and phases["timing_reserved_mb"] is None  # a GPU's allocator only
