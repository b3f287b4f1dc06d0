"""Time a callable the way docs/oracle.md's "Timing" asks, for candidates and baselines alike.

GPU: warm-up; then each call between two CUDA events, with the L2 cache flushed before it and the inputs
rotated among several pre-made sets; the median of enough calls that its spread is small. Calls are issued
in batches, each behind a head start: the GPU spins (`torch.cuda._sleep`) for about twice as long as the
host took to issue the last batch, so every call of the batch is queued before the GPU reaches it and its
events hold its GPU work alone, however slowly a busy host issues it. Without it, a launch-bound kernel
timed beside a machine full of compilers was timed at 2-3x its quiet time: the GPU waited between the
call's launches inside the events. Then a block of calls timed by the wall clock and synchronised once at
the end: the cross-check against work the events did not see (a side stream, a background thread, time
the host spends between launches). CPU: the same protocol with `perf_counter`.

The functions this module relies on are bound when it is imported, before any candidate code runs, so a
candidate that patches `torch.cuda.synchronize`, `torch.cuda.Event` or `time.perf_counter` afterwards
does not change how it is timed.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

import torch

_perf_counter = time.perf_counter
_Event = torch.cuda.Event
_event_record = torch.cuda.Event.record
_event_elapsed = torch.cuda.Event.elapsed_time
_cuda_synchronize = torch.cuda.synchronize
_tensor_zero = torch.Tensor.zero_
_cuda_spin = torch.cuda._sleep  # a kernel that spins for a number of GPU clock cycles

L2_FLUSH_BYTES = 256 * 1024 * 1024  # several times the H200's 60 MB L2
WALL_BLOCK_S = 0.2  # a wall-clock block of a slow kernel is cut to about this long
# The GPU's spin before a batch: at least, at most. A candidate that synchronises inside its call (common in
# model-written code) makes the host wait out each batch's spin: at the most, 5 ms a batch of 10 calls.
HEAD_START_MS = (0.5, 5.0)
# A wall clock this far above the events means work they did not see (docs/oracle.md, "Timing"). A busy host
# only ever adds to a wall clock, so a block that disagrees is clocked again, up to WALL_ROUNDS blocks in all,
# and the fastest counts: hidden work is in every block, a compiler that held the core is not.
WALL_RATIO, WALL_MARGIN_MS = 1.5, 0.05
WALL_ROUNDS = 3
# A block whose last synchronise waited no longer than this for the GPU (calls' worth of the median, plus a
# margin for the synchronise and, on the trusted side, two messages: beside 15 builds on an H200 its waits
# for a launch-bound kernel's block were 0.10-0.26 ms, the worker's own 0.02-0.05) was held up by the host,
# not by GPU work the events missed, which leaves the GPU milliseconds behind at the end of a 20-ms block.
DRAIN_CALLS, DRAIN_MARGIN_MS = 2.0, 0.5


def wall_disagrees(wall_ms: float, median_ms: float, allowed_ratio: float = 1.0) -> bool:
    """Whether a wall clock is past what the events allow: WALL_RATIO times the median (times the ratio the
    task's eager baseline showed, where that is larger) and WALL_MARGIN_MS more than it."""
    ratio = wall_ms / median_ms if median_ms > 0 else math.inf
    return ratio > WALL_RATIO * max(1.0, allowed_ratio) and wall_ms - median_ms > WALL_MARGIN_MS


def drained_at_once(drain_ms: float | None, median_ms: float) -> bool:
    """Whether a block's GPU had caught up with its host when the host issued the last call: work the events
    miss (another stream) leaves the GPU behind, to be waited for at the end of the block; a slow host
    leaves it idle, waiting for the next launch. None (a CPU, or no such clock): unknown, so no."""
    return drain_ms is not None and drain_ms <= DRAIN_CALLS * median_ms + DRAIN_MARGIN_MS


@dataclass
class TimingParams:
    warmup_calls: int = 5
    min_calls: int = 20
    max_calls: int = 300
    target_s: float = 1.0  # stop adding calls once this much measured time is spent (past min_calls)
    wall_calls: int = 20  # calls in the wall-clock block
    flush_l2: bool = True
    # A kernel so slow that min_calls would take longer than slow_cut_s stops there, but not below
    # slow_min_calls: the median of a few 100-ms calls is as steady as that of twenty, and twenty such calls
    # held the device alone for seconds while every other candidate waited.
    slow_min_calls: int = 5
    slow_cut_s: float = 1.0
    # From steady_calls on, timing also stops once the median is known to within `precision` of itself (the
    # half-width of its distribution-free 95% confidence interval, `median_interval`): more calls of a steady
    # kernel would not move it, and every call is device time held alone. A noisy one goes on as before, and
    # so does one whose quartiles lie more than `steady_spread` apart: calls from two levels (a slow start,
    # something else on the GPU for a while) can pin the median inside one of them, as the interval assumes
    # calls that do not change over time. On an H200 two timings of 53 stopped so, at 1.15x and 2.6x the
    # kernel's time, with quartile spreads of 13% and 62% (a steady kernel's: well under 1%).
    steady_calls: int = 50
    precision: float = 0.005
    steady_spread: float = 0.02

    def wants_more(self, calls: int, spent_s: float, samples: Sequence[float] | None = None) -> bool:
        """Whether timing goes on after `calls` calls that took `spent_s` seconds in all: at least min_calls
        (slow_min_calls once slow_cut_s is spent), and on until target_s is spent or, from steady_calls on,
        until `samples` (the calls' times) pin their median down to `precision`."""
        if calls >= self.max_calls:
            return False
        if calls < min(self.min_calls, self.slow_min_calls):
            return True
        if calls >= self.steady_calls and samples and self.steady(samples):
            return False
        return spent_s < self.target_s or (calls < self.min_calls and spent_s < self.slow_cut_s)

    def steady(self, samples: Sequence[float]) -> bool:
        """Whether the calls' median is pinned down to `precision` and their quartiles lie within
        `steady_spread` of it (see `steady_calls`)."""
        if median_precision(samples) > self.precision:
            return False
        q1, median, q3 = _quartiles(samples)
        return median > 0 and (q3 - q1) / median <= self.steady_spread

    def next_batch(self, calls: int, spent_s: float) -> int:
        """How many calls the GPU timer issues before it next reads its events: up to 10, the first
        slow_min_calls, and later ones no more than `wants_more` will want at the time per call so far."""
        size = min(10, self.max_calls - calls)
        if calls == 0:
            return max(1, min(size, self.slow_min_calls))
        if spent_s <= 0:
            return max(1, size)
        per_call = spent_s / calls
        to_target = math.ceil((self.target_s - spent_s) / per_call)
        to_min = min(self.min_calls - calls, math.ceil((self.slow_cut_s - spent_s) / per_call))
        return max(1, min(size, max(to_target, to_min)))

    def wall_block(self, median_ms: float) -> int:
        """Calls in a wall-clock block: `wall_calls`, or fewer (at least 3) where those would take longer than
        WALL_BLOCK_S (the block is for overheads of microseconds, which a 100-ms call does not show anyway)."""
        if median_ms <= 0 or median_ms * self.wall_calls <= WALL_BLOCK_S * 1e3:
            return self.wall_calls
        return max(min(3, self.wall_calls), math.ceil(WALL_BLOCK_S * 1e3 / median_ms))


@dataclass
class Timing:
    median_ms: float
    q1_ms: float
    q3_ms: float
    calls: int
    wall_ms: float  # per call, from the synchronised wall-clock block (no flushes): the fastest of its rounds
    rotate_sets: int
    wall_rounds: int = 1  # wall-clock blocks clocked (more than one when the first disagreed with the events)
    median_precision: float | None = None  # `median_precision` of the timed calls: the median is this close
    # GPU only: how long the fastest block's final synchronise waited after its last call was issued
    wall_drain_ms: float | None = None

    @property
    def spread(self) -> float:
        """Interquartile range over the median."""
        return (self.q3_ms - self.q1_ms) / self.median_ms if self.median_ms > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["spread"] = round(self.spread, 4)
        return data


def median_interval(values: Sequence[float]) -> tuple[float, float]:
    """A 95% confidence interval for the median of the distribution `values` were drawn from, whatever its
    shape: the order statistics n/2 -+ 0.98 sqrt(n) (the binomial's normal approximation; values sorted)."""
    ordered = sorted(values)
    n = len(ordered)
    half = 0.98 * math.sqrt(n)
    return ordered[max(0, math.floor(n / 2 - half))], ordered[min(n - 1, math.ceil(n / 2 + half))]


def median_precision(values: Sequence[float]) -> float:
    """The half-width of `median_interval` over the median (inf when the median is not positive)."""
    low, high = median_interval(values)
    median = statistics.median(values)
    return (high - low) / 2 / median if median > 0 else math.inf


def _quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    if len(values) < 4:
        m = statistics.median(values)
        return min(values), m, max(values)
    q = statistics.quantiles(values, n=4)
    return q[0], q[1], q[2]


def block_calls(median_ms: float | None, minimum: int, block_s: float = 0.02, maximum: int = 10000) -> int:
    """Calls in the block the trusted side clocks from outside the worker: enough that the two messages
    around it (tens of microseconds) are a small part of it."""
    if not median_ms or median_ms <= 0:
        return max(1, minimum)
    return int(min(maximum, max(minimum, -(-block_s * 1e3 // median_ms))))


def block_rounds(calls: int, measured_ms: Any, short_s: float = 0.05) -> int:
    """Rounds of the block the trusted side clocks: WALL_ROUNDS where a round is short (a fast kernel, whose
    wall clock a busy host can double), one for a slow kernel, where a host's delays do not show."""
    try:
        ms = float(measured_ms)
    except (TypeError, ValueError):
        return WALL_ROUNDS
    return WALL_ROUNDS if not ms > 0 or calls * ms <= short_s * 1e3 else 1


def sync(device: str) -> None:
    if device == "cuda":
        _cuda_synchronize()


def time_calls(fn: Callable[..., Any], input_sets: Sequence[Sequence[Any]], device: str, params: TimingParams | None = None,
               keep: Callable[[int, Any], None] | None = None) -> Timing:
    """Median time per call of `fn(*inputs)`, cycling over `input_sets`.

    `keep(set_index, output)`, when given, receives the output of every timed call (outside the timed
    region, without synchronising), so the caller can have the outputs of timed calls checked too: a
    candidate that is right only while being checked is caught."""
    params = params or TimingParams()
    n_sets = len(input_sets)
    for i in range(params.warmup_calls):
        fn(*input_sets[i % n_sets])
    sync(device)
    samples = _time_cuda(fn, input_sets, params, keep) if device == "cuda" else _time_cpu(fn, input_sets, params, keep)
    q1, med, q3 = _quartiles(samples)

    wall_calls = params.wall_block(med)
    wall = back_to_back(fn, input_sets, device, wall_calls, keep)
    rounds = 1
    while rounds < WALL_ROUNDS and wall_disagrees(wall[0], med):
        wall, rounds = min(wall, back_to_back(fn, input_sets, device, wall_calls, keep)), rounds + 1
    return Timing(med, q1, q3, len(samples), wall[0], n_sets, rounds, round(median_precision(samples), 5),
                  wall[1] if device == "cuda" else None)


def back_to_back(fn: Callable[..., Any], input_sets: Sequence[Sequence[Any]], device: str, calls: int,
                keep: Callable[[int, Any], None] | None) -> tuple[float, float]:
    """`calls` calls back to back, synchronised before and after, by the wall clock: the time per call,
    and the milliseconds the final synchronise waited once the host had issued the last call."""
    sync(device)
    start = _perf_counter()
    for i in range(calls):
        out = fn(*input_sets[i % len(input_sets)])
        if keep is not None:
            keep(i % len(input_sets), out)
    issued = _perf_counter()
    sync(device)
    end = _perf_counter()
    return (end - start) * 1e3 / calls, (end - issued) * 1e3


def held_like_a_candidate(device: str, n_sets: int) -> Callable[[int, Any], None] | None:
    """A `keep` for the baselines that holds their last outputs as a candidate's timing does (it keeps the
    last `n_sets + 1` to catch a reused output, `oracle.harness._Keeper`), so both are timed under the same
    allocation. On a CPU that matters: memory a held output keeps cannot be handed out again, and fresh
    pages cost a fault each (a 16 MB output took 2.3 ms a call held, 1.5 ms not). On a GPU the caching
    allocator makes it free, and holding would cost device memory: None there."""
    if device != "cpu":
        return None
    recent: deque[Any] = deque(maxlen=n_sets + 1)
    return lambda index, out: recent.append(out)


def _time_cpu(fn, input_sets, params: TimingParams, keep=None) -> list[float]:
    samples: list[float] = []
    spent = 0.0
    while params.wants_more(len(samples), spent, samples):
        inputs = input_sets[len(samples) % len(input_sets)]
        t0 = _perf_counter()
        out = fn(*inputs)
        dt = _perf_counter() - t0
        if keep is not None:
            keep(len(samples) % len(input_sets), out)
        samples.append(dt * 1e3)
        spent += dt
    return samples


def head_start_ms(issue_ms: float, calls_then: int, calls_next: int) -> float:
    """The GPU's spin before the next batch: twice what issuing `calls_next` calls took the host, at the
    rate of the last batch (`calls_then` calls in `issue_ms`), within HEAD_START_MS; before any batch, the
    most. A candidate that synchronises inside its call makes the host wait for the spin itself: the cap
    bounds that cost."""
    low, high = HEAD_START_MS
    if calls_then <= 0:
        return high
    per_call = issue_ms / calls_then
    return min(high, max(low, 2.0 * per_call * calls_next))


_CYCLES_PER_MS: float | None = None  # set by the first call below, in each process


def _spin_cycles_per_ms() -> float:
    """GPU clock cycles a millisecond of `torch.cuda._sleep` takes, measured once per process."""
    global _CYCLES_PER_MS
    if _CYCLES_PER_MS is None:
        cycles = 1_000_000
        _cuda_spin(cycles)  # the first launch loads the kernel
        start, end = _Event(enable_timing=True), _Event(enable_timing=True)
        _event_record(start)
        _cuda_spin(cycles)
        _event_record(end)
        _cuda_synchronize()
        _CYCLES_PER_MS = cycles / max(1e-3, _event_elapsed(start, end))
    return _CYCLES_PER_MS


def _time_cuda(fn, input_sets, params: TimingParams, keep=None) -> list[float]:
    flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.float32, device="cuda") if params.flush_l2 else None
    cycles_per_ms = _spin_cycles_per_ms()
    samples: list[float] = []
    spent_ms = 0.0
    issued = (0.0, 0)  # the last batch: the host's milliseconds to issue it, and its calls
    # Calls are issued in batches so that the host never waits on each one; events are read per batch.
    while params.wants_more(len(samples), spent_ms / 1e3, samples):
        size = params.next_batch(len(samples), spent_ms / 1e3)
        _cuda_spin(int(head_start_ms(issued[0], issued[1], size) * cycles_per_ms))
        t0 = _perf_counter()
        batch = []
        for _ in range(size):
            index = (len(samples) + len(batch)) % len(input_sets)
            inputs = input_sets[index]
            if flush is not None:
                _tensor_zero(flush)
            start, end = _Event(enable_timing=True), _Event(enable_timing=True)
            _event_record(start)
            out = fn(*inputs)
            _event_record(end)
            if keep is not None:
                keep(index, out)
            batch.append((start, end))
        issued = ((_perf_counter() - t0) * 1e3, size)
        _cuda_synchronize()
        for start, end in batch:
            ms = _event_elapsed(start, end)
            samples.append(ms)
            spent_ms += ms
    return samples
