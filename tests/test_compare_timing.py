"""Output comparison (docs/oracle.md, Correctness) and the timing protocol, without any worker."""

from __future__ import annotations

import time

import torch

from oracle.compare import compare
from oracle.timing import TimingParams, time_calls


def test_within_tolerance_passes_and_beyond_fails():
    ref = torch.randn(64, 64)
    assert compare(ref + 5e-5, ref).ok
    bad = ref.clone()
    bad[3, 4] += 1e-2
    result = compare(bad, ref)
    assert not result.ok and "at [3, 4]" in result.message and "1 of 4096" in result.message


def test_half_precision_has_looser_tolerance():
    ref = torch.randn(128, dtype=torch.float16)
    assert compare(ref + 5e-3, ref).ok
    assert not compare(ref.float(), ref).ok  # dtype must match


def test_nan_and_inf_must_match_the_reference():
    ref = torch.tensor([1.0, float("nan"), float("inf"), -float("inf")])
    assert compare(ref.clone(), ref).ok
    assert not compare(torch.tensor([1.0, 0.0, float("inf"), -float("inf")]), ref).ok
    assert not compare(torch.tensor([1.0, float("nan"), -float("inf"), -float("inf")]), ref).ok
    unwritten = torch.tensor([1.0, 2.0, float("nan")])
    msg = compare(unwritten, torch.tensor([1.0, 2.0, 3.0])).message
    assert "NaN" in msg and "unwritten" in msg


def test_tiny_values_need_relative_accuracy_too():
    ref = torch.full((1000,), 2.5e-6)
    result = compare(torch.zeros(1000), ref)
    assert not result.ok and "relative L2" in result.message


def test_shape_and_type_checks():
    ref = torch.randn(4, 4)
    assert "shape" in compare(torch.randn(4, 5), ref).message

    class Faker(torch.Tensor):
        pass

    assert "plain torch.Tensor" in compare(ref.as_subclass(Faker), ref).message


def test_cpu_timing_median_is_close_to_the_truth():
    def sleeper(x):
        time.sleep(0.005)
        return x

    t = time_calls(sleeper, [[torch.zeros(1)], [torch.ones(1)]], "cpu",
                   TimingParams(warmup_calls=1, min_calls=10, max_calls=10, target_s=0, wall_calls=5))
    assert t.calls == 10 and t.rotate_sets == 2
    assert 4.5 <= t.median_ms <= 15 and 4.5 <= t.wall_ms <= 20
