"""Output comparison (docs/oracle.md, Correctness) and the timing protocol, without any worker."""

from __future__ import annotations

import time

import pytest
import torch

from oracle.compare import compare
from oracle.timing import HEAD_START_MS, TimingParams, head_start_ms, median_interval, median_precision, time_calls


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


def test_a_kernel_slower_than_the_slow_cut_is_timed_a_few_times():
    """Twenty calls of a 300-ms kernel, and twenty more for the wall-clock block, held the device alone for
    twelve seconds while every other candidate waited: past slow_cut_s a few calls do."""
    calls = []

    def slow(x):
        calls.append(1)
        time.sleep(0.3)
        return x

    params = TimingParams(warmup_calls=1, min_calls=20, max_calls=300, target_s=0.5, wall_calls=20, slow_cut_s=1.0)
    t = time_calls(slow, [[torch.zeros(1)]], "cpu", params)
    assert t.calls == params.slow_min_calls  # 1.2 s spent after 4 calls; at least slow_min_calls
    assert len(calls) == 1 + t.calls + 3  # warm-up, timed calls, a wall-clock block of 3 (not 20)
    assert 280 <= t.median_ms <= 900


def test_the_slow_cut_leaves_fast_kernels_their_min_calls():
    params = TimingParams(warmup_calls=0, min_calls=20, max_calls=300, target_s=0.0, wall_calls=5)
    t = time_calls(lambda x: x, [[torch.zeros(1)]], "cpu", params)
    assert t.calls == 20
    default = TimingParams()  # 20 calls in a wall-clock block, cut to about 0.2 s
    assert default.wall_block(0.01) == 20 and default.wall_block(10.0) == 20
    assert default.wall_block(20.0) == 10 and default.wall_block(100.0) == 3


def test_the_gpu_timer_issues_no_batch_past_what_the_slow_cut_wants():
    p = TimingParams()  # min_calls 20, target 1 s, slow cut 1 s, at least 5
    assert p.next_batch(0, 0.0) == 5
    assert p.next_batch(5, 5 * 0.000_05) == 10  # a 50-us kernel: full batches
    assert p.next_batch(5, 5 * 0.158) == 2  # a 158-ms kernel: two more calls reach the cut
    assert not p.wants_more(7, 7 * 0.158)
    calls, spent = 0, 0.0  # the whole loop, at 158 ms a call
    while p.wants_more(calls, spent):
        n = p.next_batch(calls, spent)
        calls, spent = calls + n, spent + n * 0.158
    assert calls == 7
    calls, spent = 0, 0.0  # and at 0.2 ms a call: min_calls, then on to target_s
    while p.wants_more(calls, spent):
        n = p.next_batch(calls, spent)
        calls, spent = calls + n, spent + n * 0.0002
    assert calls == p.max_calls


def test_the_medians_interval_holds_the_ranks_around_the_middle():
    values = list(range(100, 0, -1))  # 1..100, any order
    assert median_interval(values) == (41, 61)  # ranks 50 -+ 9.8, rounded outward (0-based 40 and 60)
    assert median_interval([5.0]) == (5.0, 5.0)
    assert median_precision([2.0] * 30) == 0.0
    assert median_precision([1.0, 1.0, 1.0, 1.0, 1.1, 1.1, 1.1, 1.1]) > 0.04  # split halves: nothing is known
    assert median_precision([0.0, 0.0, 0.0]) == float("inf")


def test_a_steady_kernels_timing_stops_once_its_median_is_pinned_down():
    """A steady kernel stops at steady_calls, not at target_s or max_calls: more calls would not move its median,
    and each one is device time held alone. A noisy one goes on as before; below steady_calls nothing stops."""
    import random

    p = TimingParams()  # steady from 50 calls, to 0.5%
    rng = random.Random(0)
    steady = [1.0 + rng.gauss(0, 0.002) for _ in range(300)]
    noisy = [1.0 + rng.expovariate(1 / 0.2) for _ in range(300)]

    def run(samples_ms: list[float], params: TimingParams = p) -> int:
        calls, spent = 0, 0.0
        while params.wants_more(calls, spent / 1e3, samples_ms[:calls]):
            n = params.next_batch(calls, spent / 1e3)
            spent += sum(samples_ms[calls:calls + n])
            calls += n
        return calls

    assert p.steady_calls <= run(steady) < p.steady_calls + 10  # at the first batch's end past it
    assert run(noisy) == p.max_calls  # 1-ms calls: target_s would want 1000
    assert p.wants_more(40, 0.04, steady[:40])  # too few calls to stop on precision
    assert TimingParams(precision=0.0).wants_more(50, 0.05, steady[:50])  # precision 0: never pinned down
    # Two levels (on an H200, 155 calls: the first quartile at 1.56 ms, the median and third at 4.06 ms): the
    # median sits pinned inside the slow one, but the quartiles are far apart, so the timing goes on by the
    # rule without the steady stop. Here 7 calls in 20 are fast.
    two_levels = [1.56 + rng.gauss(0, 0.002) if i % 20 < 7 else 4.06 + rng.gauss(0, 0.004) for i in range(300)]
    assert median_precision(two_levels[:155]) <= p.precision  # what alone would have stopped it
    assert run(two_levels) == run(two_levels, TimingParams(steady_calls=p.max_calls + 1)) == p.max_calls
    slow_start = [1.70] * 20 + [1.52 + rng.gauss(0, 0.001) for _ in range(280)]  # a slow first 20 calls
    assert not p.steady(slow_start[:55]) and p.steady(slow_start[:300])
    t = time_calls(lambda x: x, [[torch.zeros(1)]], "cpu", TimingParams(warmup_calls=0, wall_calls=3))
    assert t.median_precision is not None and t.to_json()["median_precision"] == t.median_precision


def test_the_gpus_head_start_is_twice_what_the_host_took_to_issue_a_batch():
    """Before each batch of timed calls the GPU spins for about twice the host's issuing time at the last
    batch's rate, so that every call is queued before the GPU reaches it (oracle.timing)."""
    low, high = HEAD_START_MS
    assert head_start_ms(0.0, 0, 5) == high  # nothing issued yet: the most
    assert head_start_ms(2.0, 10, 10) == pytest.approx(4.0)  # 0.2 ms a call, ten calls
    assert head_start_ms(2.0, 10, 5) == pytest.approx(2.0)  # the same rate, half the calls
    assert head_start_ms(0.01, 10, 10) == low  # a fast host: the floor
    assert head_start_ms(500.0, 2, 10) == high  # a call that waits on the GPU itself: the cap


def _slowed(calls_before: int, until: int | None, seconds: float):
    """An identity whose calls number `calls_before` to `until` (all later ones when None) sleep `seconds`."""
    made = []

    def fn(x):
        made.append(1)
        if len(made) > calls_before and (until is None or len(made) <= until):
            time.sleep(seconds)
        return x
    return fn, made


def test_a_wall_clock_block_a_busy_host_slowed_is_clocked_again_and_the_fastest_counts():
    """A launch-bound kernel's wall-clock block came out at 4x its events in one fresh process of three
    beside 15 builds; a busy host only adds to a wall clock, so a block that disagrees is clocked again."""
    params = TimingParams(warmup_calls=1, min_calls=10, max_calls=10, target_s=0, wall_calls=5)
    fn, made = _slowed(11, 16, 0.004)  # after the warm-up and the 10 timed calls: the first block only
    t = time_calls(fn, [[torch.zeros(1)]], "cpu", params)
    assert t.wall_rounds >= 2 and len(made) == 11 + 5 * t.wall_rounds
    assert t.wall_ms < 1.0, t  # the second block's, not the first's 4 ms a call


def test_work_the_events_miss_is_in_every_wall_clock_round():
    """Hidden work (another stream, a thread the call waits for) does not go away when clocked again: the
    wall clock stays high after its WALL_ROUNDS rounds, and the judge scores by it."""
    from oracle import judge
    from oracle.timing import WALL_ROUNDS

    params = TimingParams(warmup_calls=1, min_calls=10, max_calls=10, target_s=0, wall_calls=5)
    fn, made = _slowed(11, None, 0.004)
    t = time_calls(fn, [[torch.zeros(1)]], "cpu", params)
    assert t.wall_rounds == WALL_ROUNDS and len(made) == 11 + 5 * WALL_ROUNDS and t.wall_ms >= 3.5
    fields = judge.score(t.to_json(), {"median_ms": 1.0, "wall_ms": 1.0}, None, [])
    assert "wall_clock_disagrees" in fields["flags"] and fields["time_ms"] == t.wall_ms


def test_a_wall_clock_that_agrees_is_clocked_once():
    """Calls of 10 ms each: a block disagrees only past 15 ms a call, which no scheduler's hiccup reaches
    (an identity's block of microseconds would disagree with one 0.3-ms stall)."""
    fn, made = _slowed(0, None, 0.01)
    t = time_calls(fn, [[torch.zeros(1)]], "cpu",
                   TimingParams(warmup_calls=1, min_calls=10, max_calls=10, target_s=0, wall_calls=3))
    assert t.wall_rounds == 1 and len(made) == 1 + 10 + 3
    assert t.wall_drain_ms is None  # a CPU's calls end when they return: no GPU to catch up with


def test_a_block_whose_gpu_caught_up_at_its_last_launch_drained_at_once():
    from oracle.timing import drained_at_once

    assert drained_at_once(0.03, 0.02)  # a launch-bound kernel: the sync waits for one call's work, or less
    assert drained_at_once(0.26, 0.02)  # the trusted side's wait, two messages on a busy host included
    assert not drained_at_once(5.0, 0.02)  # work another stream still had: the GPU was behind the host
    assert not drained_at_once(None, 0.02)


def test_the_trusted_side_keeps_the_fastest_round_of_its_clocked_block():
    from oracle.evaluate import external_block
    from oracle.timing import WALL_ROUNDS, block_rounds

    clocks = {"block_start 0": 1.0, "block_issued 0": 1.01, "block_end 0": 1.04,
              "block_start 1": 2.0, "block_issued 1": 2.008, "block_end 1": 2.01,
              "block_start 2": 3.0}  # the third round never ended: it does not count
    block = external_block(clocks, 10)
    assert block is not None and block.rounds == 2  # the rounds that ended
    assert block.per_call_ms == pytest.approx(1.0) and block.drain_ms == pytest.approx(2.0)  # 10 ms over 10 calls
    assert external_block({"block_start 0": 1.0}, 10) is None and external_block(clocks, 0) is None
    no_mark = external_block({"block_start 0": 1.0, "block_end 0": 1.01}, 10)
    assert no_mark is not None and no_mark.drain_ms is None  # a drain it cannot tell is unknown, not zero
    out_of_order = external_block({"block_start 0": 1.0, "block_issued 0": 0.5, "block_end 0": 1.01}, 10)
    assert out_of_order is not None and out_of_order.drain_ms is None
    assert block_rounds(1000, 0.02) == WALL_ROUNDS  # a 20-ms block: a busy host can double it
    assert block_rounds(3, 200.0) == 1  # 0.6 s: a host's delays do not show
    assert block_rounds(20, "fast") == WALL_ROUNDS and block_rounds(20, float("nan")) == WALL_ROUNDS
