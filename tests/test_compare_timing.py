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


def test_cpu_baselines_hold_their_last_outputs_as_a_candidates_timing_does():
    """A candidate's timing holds its last n_sets + 1 outputs (to catch a reused one); on a CPU, memory held
    cannot be handed out again and fresh pages fault, so the baselines are timed holding theirs too."""
    import weakref

    from oracle.timing import held_like_a_candidate

    outputs: list[weakref.ref] = []

    def fn(x):
        out = x * 2
        outputs.append(weakref.ref(out))
        return out

    sets = [[torch.randn(8)] for _ in range(4)]
    keep = held_like_a_candidate("cpu", len(sets))
    time_calls(fn, sets, "cpu", TimingParams(warmup_calls=1, min_calls=10, max_calls=10, wall_calls=5), keep=keep)
    assert sum(r() is not None for r in outputs) == len(sets) + 1  # the last five, while `keep` lives
    assert held_like_a_candidate("cuda", 4) is None  # the caching allocator makes holding free there


def test_the_reference_process_times_eager_holding_its_outputs(tmp_path):
    """Through the real reference process: eager PyTorch is timed with its last outputs held, so no output's
    memory is handed out again within five calls (without holding, the allocator reuses it at once)."""
    from oracle import Oracle, OracleConfig
    from tasks.model import Task

    seen = tmp_path / "addresses.txt"
    code = f'''
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        out = x * 2
        with open({str(seen)!r}, "a") as f:
            f.write(str(out.data_ptr()) + chr(10))
        return out

def get_inputs():
    return [torch.randn(64)]

def get_init_inputs():
    return []
'''
    task = Task(id="builtin/held", level=None, problem_id=None, name="held", code=code, origin="test", sizes={})
    oracle = Oracle(OracleConfig(device="cpu", cache_dir=tmp_path / "cache", allow_torch=True,
                                 timing=TimingParams(warmup_calls=1, min_calls=20, max_calls=20, wall_calls=10)))
    try:
        oracle.references.get(task)  # prepares the reference, then times eager: the last calls made
    finally:
        oracle.close()
    last = [int(line) for line in seen.read_text().split()][-25:]  # the timed calls and the clocked block
    assert all(len(set(last[i:i + 5])) == 5 for i in range(len(last) - 4)), last
