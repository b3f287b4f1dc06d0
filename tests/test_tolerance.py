"""Tolerance policies (docs/oracle.md, "Tolerance policies"): the rules on plain tensors, then the CPU oracle
judging the same candidates under each policy, and the report recomputing pass@k under another one."""

from __future__ import annotations

import json

import pytest
import torch

from oracle.compare import compare
from oracle.judge import check_name, judge_outputs
from oracle.protocol import ErrorFigures
from oracle.tolerance import NUMERIC_FACTOR, NUMERIC_FLOOR, POLICIES, UNBOUNDED, Float64Scale


def _matmul_case(k: int = 4096, seed: int = 0):
    """A long reduction: float32 reference (PyTorch's GEMM), float64 truth, and the float64 correction."""
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(32, k, generator=g), torch.randn(k, 48, generator=g)
    ref = a @ b
    ref64 = a.double() @ b.double()
    correction = (ref64 - ref.double()).float()
    d = ref.double() - ref64
    scale = Float64Scale(float(d.norm() / ref64.norm()), float(d.abs().max() / ref64.abs().max()))
    return a, b, ref, correction, scale


def _naive_loop(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A float32 sum over k in plain order, one step at a time: another summation order than the GEMM's."""
    out = torch.zeros(a.shape[0], b.shape[1])
    for i in range(a.shape[1]):
        out += a[:, i:i + 1] * b[i:i + 1, :]
    return out


def _verdicts(out, ref, correction, scale) -> dict[str, bool]:
    return {p: compare(out, ref, policy=p, correction=correction, scale=scale).ok for p in POLICIES}


def test_another_summation_order_passes_every_policy():
    a, b, ref, correction, scale = _matmul_case()
    result = compare(_naive_loop(a, b), ref, policy="numeric", correction=correction, scale=scale)
    assert result.ok and result.passes == list(POLICIES), result.message
    assert result.figures.rel_l2_64 > 0 and result.figures.over_bound["numeric"] <= 1


def test_output_rounded_to_bfloat16_passes_only_kernelbench_v0_1():
    a, b, ref, correction, scale = _matmul_case()
    rounded = ref.bfloat16().float()
    assert _verdicts(rounded, ref, correction, scale) == {"kernelbench": False, "kernelbench-v0.1": True, "numeric": False}
    message = compare(rounded, ref, policy="numeric", correction=correction, scale=scale).message
    assert "float64" in message


def test_one_wrong_element_fails_every_policy_and_is_named():
    a, b, ref, correction, scale = _matmul_case()
    bad = ref.clone()
    bad[5, 7] += 1.0
    result = compare(bad, ref, policy="numeric", correction=correction, scale=scale)
    assert result.passes == [] and "at [5, 7]" in result.message
    assert all(result.figures.over_bound[p] > 1 for p in POLICIES)
    assert result.figures.max_abs >= 0.99


def test_exact_float32_reference_leaves_the_floor():
    """A ReLU: float32 is exact, so the scale is 0 and only the floor stands between right and rounded."""
    x = torch.randn(10000)
    ref = torch.relu(x)
    zero = torch.zeros_like(ref)
    exact = Float64Scale(0.0, 0.0)
    assert compare(ref.clone(), ref, policy="numeric", correction=zero, scale=exact).ok
    nudged = ref * (1 + 2 ** -23)  # one ulp: far inside the floor
    assert compare(nudged, ref, policy="numeric", correction=zero, scale=exact).ok
    halved = ref.half().float()
    result = compare(halved, ref, policy="numeric", correction=zero, scale=exact)
    assert not result.ok and result.figures.over_bound["numeric"] > 1
    assert result.figures.rel_l2_64 > NUMERIC_FACTOR * NUMERIC_FLOOR


def test_without_a_float64_reference_numeric_is_kernelbench():
    ref = torch.randn(256)
    for out in (ref + 5e-5, ref + 5e-3):
        kb = compare(out, ref, policy="kernelbench")
        numeric = compare(out, ref, policy="numeric")
        assert numeric.ok == kb.ok and ("numeric" in numeric.passes) == kb.ok
        assert numeric.figures.rel_l2_64 is None


def test_misplaced_nan_and_integer_mismatch_fail_every_policy():
    ref = torch.tensor([1.0, 2.0, 3.0])
    out = torch.tensor([1.0, float("nan"), 3.0])
    result = compare(out, ref, policy="kernelbench-v0.1", correction=torch.zeros(3), scale=Float64Scale(1e-7, 1e-7))
    assert result.passes == [] and result.figures.over_bound == {p: UNBOUNDED for p in POLICIES}
    ints = compare(torch.tensor([1, 2]), torch.tensor([1, 3]))
    assert not ints.ok and ints.passes == []
    assert compare(torch.tensor([1, 2]), torch.tensor([1, 2])).passes == list(POLICIES)


def test_kernelbench_figures_say_how_far_over_the_bound():
    ref = torch.ones(100)
    result = compare(ref + 3e-4, ref)  # bound 1e-4 + 1e-4 * 1 = 2e-4
    assert not result.ok and result.figures.over_bound["kernelbench"] == __import__("pytest").approx(1.5, rel=1e-3)
    assert result.passes == ["kernelbench-v0.1", "numeric"] or result.passes == ["kernelbench-v0.1"]
    assert result.figures.max_rel == __import__("pytest").approx(3e-4, rel=1e-3)


def test_several_outputs_pass_only_the_policies_all_of_them_pass():
    ref = [torch.ones(10), torch.ones(10)]
    judged = judge_outputs([ref[0].clone(), ref[1] + 3e-3], ref, "check 1 of 6", policy="kernelbench")
    assert judged.problem.startswith("check 1 of 6: output 1:") and judged.passes == ["kernelbench-v0.1"]
    judged = judge_outputs([ref[0].clone(), ref[1] + 3e-3], ref, "check 1 of 6", policy="kernelbench-v0.1")
    assert judged.problem is None and judged.figures.max_abs > 2e-3


def test_error_figures_merge_to_the_worst():
    a = ErrorFigures(1.0, 0.1, 1e-6, 1e-7, {"kernelbench": 0.5, "numeric": 2.0})
    b = ErrorFigures(0.5, 0.2, None, 2e-7, {"kernelbench": 1.5}, float64="no float64 reference: x")
    m = a.merged(b)
    assert (m.max_abs, m.max_rel, m.rel_l2_64, m.ref32_rel_l2_64) == (1.0, 0.2, 1e-6, 2e-7)
    assert m.over_bound == {"kernelbench": 1.5, "numeric": 2.0} and m.float64 == "no float64 reference: x"
    assert ErrorFigures.from_json(m.to_json()) == m


def test_a_check_at_the_smaller_size_names_both_sizes():
    assert check_name(0, 6) == "check 1 of 6"
    name = check_name(5, 6, {"dim": 512}, {"batch_size": 16, "dim": 1024})
    assert "smaller size dim=512" in name and "task's size dim=1024" in name and "passed" in name


# ---------------------------------------------------------------- the CPU oracle, torch candidates
# (about 20 s: every candidate under every policy, with the reference made in float32 and float64)

MATMUL_TASK = '''
import json

import pytest
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.matmul(a, b)

M = 16
K = 4096
N = 32

def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]

def get_init_inputs():
    return []
'''

# A task whose float64 copy cannot run: its forward pins one operand to float32, and a matmul of float32 by
# float64 is refused.
PINNED_TASK = MATMUL_TASK.replace("return torch.matmul(a, b)", "return torch.matmul(a.float(), b)")

CANDIDATE = '''
import json

import pytest
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
{body}
'''
# The reduction over K in blocks of 512, summed from the last block to the first: another order, as right.
HONEST = "        out = torch.zeros(a.shape[0], b.shape[1])\n" \
         "        for i in reversed(range(0, a.shape[1], 512)):\n" \
         "            out = out + a[:, i:i + 512] @ b[i:i + 512]\n        return out"
ROUNDED = "        return (a @ b).bfloat16().float()"
ONE_WRONG = "        out = a @ b\n        out[3, 5] += 1.0\n        return out"
CANDIDATES = {"honest": HONEST, "bf16": ROUNDED, "one_wrong": ONE_WRONG}
EXPECTED = {"honest": POLICIES, "bf16": ("kernelbench-v0.1",), "one_wrong": ()}


def _candidate(body: str) -> str:
    return CANDIDATE.format(body=body)


def _task(code: str, name: str):
    from tasks.model import Task

    return Task(id=f"builtin/{name}", level=None, problem_id=None, name=name, code=code, origin="test",
                sizes={"M": 16, "K": 4096, "N": 32})


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    """Each candidate judged under each policy by a CPU oracle (plain PyTorch candidates: nothing to build)."""
    from oracle import Oracle, OracleConfig
    from oracle.timing import TimingParams

    cache = tmp_path_factory.mktemp("tolerance-cache")
    fast = TimingParams(warmup_calls=1, min_calls=3, max_calls=5, target_s=0.05, wall_calls=3)
    task = _task(MATMUL_TASK, "matmul_k4096")
    found = {}
    for policy in POLICIES:
        oracle = Oracle(OracleConfig(device="cpu", cache_dir=cache, allow_torch=True, timing=fast, tolerance=policy))
        for name, body in CANDIDATES.items():
            found[policy, name] = oracle.evaluate(task, _candidate(body), "torch")
        if policy == "numeric":
            pinned = _task(PINNED_TASK, "matmul_pinned")
            found[policy, "pinned_bf16"] = oracle.evaluate(pinned, _candidate(ROUNDED), "torch")
            found[policy, "pinned_honest"] = oracle.evaluate(pinned, _candidate(HONEST), "torch")
            small = Oracle(OracleConfig(device="cpu", cache_dir=cache, allow_torch=True, timing=fast, tolerance=policy,
                                        float64_max_mb=0.001))  # the 2 KB output is "large" here
            found[policy, "large_bf16"] = small.evaluate(task, _candidate(ROUNDED), "torch")
            small.close()
        oracle.close()
    return found


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", list(CANDIDATES))
def test_each_candidate_gets_its_verdict_under_each_policy(verdicts, policy, name):
    v = verdicts[policy, name]
    assert v.tolerance == policy
    assert v.status == ("correct" if policy in EXPECTED[name] else "incorrect"), v.message
    assert v.passes == list(EXPECTED[name])
    assert v.errors is not None and v.errors.ref32_rel_l2_64 is not None and v.errors.float64 is None
    assert set(v.errors.over_bound) == set(POLICIES)
    if v.status == "correct":
        assert v.time_ms > 0
    elif v.passes:  # wrong under its own policy, right under another: checked to the end, not timed
        assert v.time_ms is None and "check 1 of" in v.message


@pytest.mark.slow
def test_verdicts_round_trip_through_json(verdicts):
    from oracle.verdict import Verdict

    v = verdicts["numeric", "bf16"]
    again = Verdict.from_json(json.loads(json.dumps(v.to_json())))
    assert again == v and isinstance(again.errors, ErrorFigures)


@pytest.mark.slow
def test_without_float64_numeric_falls_back_to_kernelbench_and_says_so(verdicts):
    from oracle.tolerance import FALLBACK_FLAG

    honest, rounded = verdicts["numeric", "pinned_honest"], verdicts["numeric", "pinned_bf16"]
    assert honest.status == "correct" and rounded.status == "incorrect"
    for v in (honest, rounded):
        assert FALLBACK_FLAG in v.flags and "float64" in v.errors.float64 and v.errors.rel_l2_64 is None
    assert honest.passes == list(POLICIES) and rounded.passes == ["kernelbench-v0.1"]


@pytest.mark.slow
def test_outputs_over_the_float64_limit_get_no_float64_reference(verdicts):
    from oracle.tolerance import FALLBACK_FLAG

    v = verdicts["numeric", "large_bf16"]
    assert v.status == "incorrect" and FALLBACK_FLAG in v.flags and v.passes == ["kernelbench-v0.1"]
    assert "no float64 reference: outputs of 0.00195 MB, over" in v.errors.float64 and v.errors.rel_l2_64 is None


def _records(vs):
    from search.store import SampleRecord

    return [SampleRecord(v.task, "zero-shot", round=0, chain=i, sample_index=i, seed=i, status=v.status, verdict=v)
            for i, v in enumerate(vs)]


@pytest.mark.slow
@pytest.mark.parametrize("asked", POLICIES)
@pytest.mark.parametrize("judged", POLICIES)
def test_report_under_another_policy_agrees_with_a_run_under_it(verdicts, judged, asked):
    from search.stats import RunStats

    def stats(policy: str, tolerance: str | None = None) -> RunStats:
        config = {"tolerance": policy, "plan": {"n": 3, "rounds": 1}, "tasks": [{"id": "builtin/matmul_k4096"}]}
        return RunStats(_records([verdicts[policy, n] for n in CANDIDATES]), config, tolerance=tolerance, reps=10)

    recounted, rerun = stats(judged, asked), stats(asked)
    assert recounted.summary["pass_at_k"] == rerun.summary["pass_at_k"]
    assert recounted.summary["correct"] == rerun.summary["correct"]
    assert recounted.to_json()["tolerance"] == asked


@pytest.mark.slow
def test_report_refuses_another_policy_for_runs_recorded_before_policies(verdicts):
    from search.stats import RunStats

    with pytest.raises(ValueError, match="recorded before"):
        RunStats(_records([verdicts["kernelbench", "honest"]]), {"plan": {"n": 1}}, tolerance="numeric")


LEAKY_USES_CONSTANTS = '''
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self, *args):
        super().__init__()

    def forward(self, x):
        out = torch.zeros(batch_size, dim)  # the task file's constants: right at the size they name
        out[: x.shape[0]] = torch.where(x >= 0, x, x * negative_slope) * scale
        return out
'''


@pytest.mark.slow
def test_task_constants_are_defined_and_the_smaller_size_is_named_when_only_it_fails(tmp_path):
    """The candidate uses the task's module-level constants, as KernelBench allows: right at the task's size
    (checks 1-5), wrong at the second, smaller size, and the message says which size and the sizes used."""
    from oracle import Oracle, OracleConfig
    from oracle.timing import TimingParams
    from tasks import Selection, load_tasks

    task = load_tasks("builtin", Selection(task_ids=frozenset({"builtin/1_LeakyReLU_Scale"})), 8).tasks[0]
    oracle = Oracle(OracleConfig(device="cpu", cache_dir=tmp_path, allow_torch=True, tolerance="kernelbench-v0.1",
                                 timing=TimingParams(warmup_calls=1, min_calls=3, max_calls=5, target_s=0.05, wall_calls=3)))
    try:
        v = oracle.evaluate(task, LEAKY_USES_CONSTANTS, "torch")
    finally:
        oracle.close()
    small = task.sizes["batch_size"] // 2
    assert v.status == "incorrect" and v.passes == []
    assert v.message.startswith(f"check 6 of 6 (at the second, smaller size batch_size={small}; the checks before it, "
                                f"at the task's size batch_size={task.sizes['batch_size']}, passed"), v.message
    assert "has shape" in v.message


def test_figures_stay_finite_when_the_difference_overflows():
    ref = torch.tensor([3e38, 1.0])
    out = torch.tensor([-3e38, 1.0])
    result = compare(out, ref, correction=torch.zeros(2), scale=Float64Scale(1e-8, 1e-8))
    assert result.passes == []
    figures = result.figures.to_json()
    assert figures["max_abs"] == UNBOUNDED and all(v <= UNBOUNDED for v in figures["over_bound"].values())
