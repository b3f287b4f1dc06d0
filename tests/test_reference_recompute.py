"""On a GPU, a task whose expected outputs would fill more than a quarter of the reference process's memory
is kept as its models only, and each comparison computes its input set's outputs again
(oracle.reference_server, `recomputes`): its verdicts are those of a kept reference, and it pins far less
memory, so candidates of several such tasks are judged at once instead of one after another."""

from __future__ import annotations

import contextlib
import multiprocessing
import threading
from pathlib import Path

import pytest
import torch

from oracle.harness import _reference_model, _seeded_inputs
from oracle.protocol import Case, Compare, Prepared, PrepareTask
from oracle.reference import Reference, References, ReferenceSettings
from oracle.reference_server import RECOMPUTE_DEVICES, ReferenceState, kept_bytes, recomputes
from oracle.shared_tensors import export_tensor
from oracle.timing import TimingParams
from tasks import Selection, load_tasks
from tasks.model import Task
from tasks.runtime import exec_task_code

TASK = "builtin/1_LeakyReLU_Scale"
CASES = [Case(0, seed) for seed in (11, 12, 13)]
TIMING_SEEDS = [101, 102]


@pytest.fixture(scope="module")
def task() -> Task:
    return load_tasks("builtin", Selection(task_ids=frozenset({TASK}))).tasks[0]


def _request(task: Task) -> PrepareTask:
    # float64_max_bytes 0: no float64 reference, as for the large outputs that recompute on a GPU
    return PrepareTask(key="k", task_id=task.id, codes=[task.code], cases=[c.to_json() for c in CASES],
                       timing_seeds=TIMING_SEEDS, init_seed=42, call_timeout_s=60, float64_max_bytes=0)


class _Drained:
    """The pipe's far end, read in a thread: the state sends its phase messages there."""

    def __init__(self) -> None:
        self.near, far = multiprocessing.Pipe(duplex=True)
        self._far = far
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        try:
            while True:
                self._far.recv_bytes()
        except (EOFError, OSError):
            pass


def _outputs(task: Task, seed: int) -> list[torch.Tensor]:
    """What a correct candidate returns for `seed`: the task's own model on the same seeded inputs."""
    module = exec_task_code(task.code, task.id)
    with torch.no_grad():
        out = _reference_model(module, 42, "cpu")(*_seeded_inputs(module, seed, "cpu"))
    return [out]


def _compare(state: ReferenceState, session: int, kind: str, index: int, outs: list[torch.Tensor], share: Path):
    tensors = [export_tensor(t, share, i).to_json() for i, t in enumerate(outs)]
    return state.compare(Compare(session, kind, index, tensors, str(share)))


@pytest.fixture
def recomputing_on_a_cpu(monkeypatch):
    """The rule as on a GPU, for a CPU test (on a CPU large outputs are kept: making inputs takes seconds)."""
    monkeypatch.setattr("oracle.reference_server.RECOMPUTE_DEVICES", {"cuda", "cpu"})


@pytest.mark.parametrize("budget", [1, 1 << 40], ids=["recomputed", "kept"])
def test_a_recomputed_reference_judges_as_a_kept_one(task, tmp_path, budget, recomputing_on_a_cpu):
    state = ReferenceState("cpu", budget)
    prepared = state.prepare(_request(task), _Drained().near)
    held = state.tasks["k"]
    recomputed = budget == 1
    assert prepared.recomputed is recomputed
    assert (held.outputs is None) is recomputed and (held.timing_outputs is None) is recomputed
    assert prepared.kept_bytes == (prepared.input_bytes + prepared.output_bytes if recomputed
                                   else (len(CASES) + len(TIMING_SEEDS)) * prepared.output_bytes)
    assert held.nbytes == (0 if recomputed else prepared.kept_bytes)
    session = state.open("k")
    for i, case in enumerate(CASES):
        good = _outputs(task, case.seed)
        assert _compare(state, session, "check", i, good, tmp_path).ok
        assert not _compare(state, session, "check", i, [good[0] + 1], tmp_path).ok
    for k, seed in enumerate(TIMING_SEEDS):
        assert _compare(state, session, "timed", k, _outputs(task, seed), tmp_path).ok
        # another set's outputs are not this set's
        assert not _compare(state, session, "timed", k, _outputs(task, TIMING_SEEDS[1 - k]), tmp_path).ok
    state.close(session)


def test_recomputing_takes_large_outputs_without_a_float64_reference_on_a_gpu_only():
    quarter = 1000
    assert RECOMPUTE_DEVICES == {"cuda"}
    assert recomputes(600, sets=8, float64_max_bytes=256, budget_bytes=4 * quarter, device="cuda")  # 4800 > 1000
    assert not recomputes(100, sets=8, float64_max_bytes=256, budget_bytes=4 * quarter, device="cuda")  # has float64
    assert not recomputes(600, sets=1, float64_max_bytes=256, budget_bytes=4 * quarter, device="cuda")  # fits
    assert not recomputes(600, sets=8, float64_max_bytes=256, budget_bytes=4 * quarter, device="cpu")
    assert kept_bytes(600, 500, 8, float64=False, recompute=True) == 1100
    assert kept_bytes(100, 500, 8, float64=True, recompute=False) == 1600


def _references(baselines: Path, budget: int, float64_max_bytes: int) -> References:
    settings = ReferenceSettings(device="cpu", device_name="cpu", threads=1, check_seeds=(11, 12), extra_size_seed=21,
                                 timing_seeds=(101, 102), init_seed=42, timing=TimingParams(), wants_compile=False,
                                 call_timeout_s=60, time_timeout_s=60, compile_timeout_s=60, budget_bytes=budget,
                                 float64_max_bytes=float64_max_bytes)
    return References(settings, baselines, alone=lambda *a: contextlib.nullcontext(),
                      shared=contextlib.nullcontext, register=lambda w: contextlib.nullcontext())


def _pins(refs: References, task: Task) -> int:
    with refs.pinned(task):
        return refs._resident.used


def test_a_task_not_yet_prepared_pins_what_its_inputs_say_it_will_hold(task, tmp_path, recomputing_on_a_cpu):
    size = int(task.input_mb * 1024**2)
    sets = 2 + 2 + 1  # two check seeds, the smaller size's check, two timing sets
    # a budget a quarter of which its sets' outputs would overflow: it will recompute, and pins one set
    assert _pins(_references(tmp_path, budget=4 * size, float64_max_bytes=0), task) == 2 * size
    # room for them all: it keeps them, and pins them all
    assert _pins(_references(tmp_path, budget=1000 * size, float64_max_bytes=0), task) == sets * size


def test_a_prepared_task_pins_what_the_reference_process_said_it_holds(task, tmp_path):
    refs = _references(tmp_path, budget=1 << 30, float64_max_bytes=0)

    prepared = Prepared(ops=[], kernels=[], floor=None, constant=False, output_bytes=10, input_bytes=10,
                        reference_s=0.0, recomputed=True, kept_bytes=12345)
    refs._known[refs.key(task)] = Reference(refs.key(task), [task.code], [], prepared, None)
    assert _pins(refs, task) == 12345
