"""Tolerance policies (docs/oracle.md, "Tolerance policies"): the rules on plain tensors, then the CPU oracle
judging the same candidates under each policy, and the report recomputing pass@k under another one."""

from __future__ import annotations

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
