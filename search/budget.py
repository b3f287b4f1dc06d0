"""Correctness at equal compute: what a budget per task buys under each strategy (`kernelsearch report --by`).

The estimator is stated in `search.stats`' docstring (a budget buys whole chains in random order; a chain's
cost is the sum of its rounds). Here are its records and its computation:

- `BudgetSample`: one judged sample with what it cost (tokens, generation seconds, oracle device seconds),
  its chain and round; `SharedStep`: a helper completion several samples of a task share, paid once.
- `TaskChains`: a task's chains in one budget unit, `task_curve` the estimator on one task at a grid of
  budgets, `summarize_curves` the mean over tasks with bootstrap intervals, `overtake` the budget at which
  one run gets ahead of another.
- `budget_records` is the one adapter from what a run folder holds (its `SampleRecord`s and config.json)
  to these records.

Plain records in, arrays out: nothing here reads files or prints.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from search.stats import FAST_PS, expected_best_speedup_all_k, int_or_none, level_of, number_or_none, pass_at_all_k
from search.store import SampleRecord

UNITS = ("samples", "tokens", "gpu-seconds")
UNIT_TEXT = {"samples": "samples", "tokens": "generated tokens", "gpu-seconds": "generation + oracle device seconds"}
STEPS_PER_DOUBLING = 16  # grid points per doubling of the budget for tokens and seconds (about 4.4% apart)
REPS = 2000  # random chain orders per task where chain costs differ
EPS = 1e-12
ON_DEVICE = ("correct", "incorrect", "runtime_error", "timeout", "rejected")  # verdicts reached after a build


class BudgetError(ValueError):
    """A run cannot be put on a budget axis in this unit (e.g. no generation seconds recorded); one line."""


# ---------------------------------------------------------------- records


@dataclass(frozen=True)
class BudgetSample:
    """One judged sample, as a budget sees it. `chain` groups the rounds that build on each other
    (independent samples each have a chain of their own); `speedup_vs_eager` is 0 unless correct."""

    task: str
    level: str
    chain: int
    round: int
    correct: bool
    speedup_vs_eager: float
    tokens: int  # generated tokens, its own helper completions' included
    generation_s: float | None  # None: not recorded (a run from before it was)
    oracle_device_s: float  # the checks and the timing (0 for a duplicate: it was not run again)

    def cost(self, unit: str) -> float | None:
        if unit == "samples":
            return 1.0
        if unit == "tokens":
            return float(self.tokens)
        if unit == "gpu-seconds":
            return None if self.generation_s is None else self.generation_s + self.oracle_device_s
        raise BudgetError(f"unknown budget unit '{unit}' (known: {', '.join(UNITS)})")


@dataclass(frozen=True)
class SharedStep:
    """A helper completion that several samples of a task share (one analysis for all n samples):
    paid once per task, before the first chain, whatever the budget buys."""

    task: str
    tokens: int
    generation_s: float | None

    def cost(self, unit: str) -> float | None:
        if unit == "samples":
            return 0.0
        if unit == "tokens":
            return float(self.tokens)
        return self.generation_s


@dataclass
class BudgetRecords:
    """What a run spent, sample by sample."""

    samples: list[BudgetSample] = field(default_factory=list)
    shared: list[SharedStep] = field(default_factory=list)
    unclocked: int = 0  # samples that ran on the oracle's device but came back without its seconds


@dataclass(frozen=True)
class Chain:
    """The unit a budget buys: its rounds' summed cost, whether a round was correct, its best speedup."""

    cost: float
    rounds: int
    correct: bool
    best_speedup: float  # 0 when no round was correct (or no correct round was timed)


@dataclass
class TaskChains:
    task: str
    level: str
    chains: list[Chain]
    shared_cost: float = 0.0

    @property
    def spent(self) -> float:
        return self.shared_cost + sum(c.cost for c in self.chains)

    @property
    def limit(self) -> float:
        """Budgets below this are estimated without bias: the task's spend plus its cheapest chain (a budget
        of all the recorded chains and one more would have bought another chain, whose outcome is unknown)."""
        return self.spent + min((c.cost for c in self.chains), default=0.0)


def chains_by_task(records: BudgetRecords, unit: str) -> tuple[list[TaskChains], int]:
    """Each task's chains in `unit`, in first-seen task order, and how many samples had no cost in it
    (counted as 0, which only gpu-seconds can need: a sample whose generation failed before timing)."""
    if unit not in UNITS:
        raise BudgetError(f"unknown budget unit '{unit}' (known: {', '.join(UNITS)})")
    grouped: dict[str, dict[int, list[BudgetSample]]] = defaultdict(lambda: defaultdict(list))
    levels: dict[str, str] = {}
    missing = 0
    for s in records.samples:
        grouped[s.task][s.chain].append(s)
        levels.setdefault(s.task, s.level)
    shared: dict[str, float] = defaultdict(float)
    for step in records.shared:
        cost = step.cost(unit)
        shared[step.task] += cost or 0.0
    out = []
    for task, chains in grouped.items():
        built = []
        for rounds in chains.values():
            costs = [s.cost(unit) for s in rounds]
            missing += sum(c is None for c in costs)
            speedups = [s.speedup_vs_eager for s in rounds if s.correct]
            built.append(Chain(cost=float(sum(c or 0.0 for c in costs)), rounds=len(rounds),
                               correct=any(s.correct for s in rounds), best_speedup=max(speedups, default=0.0)))
        out.append(TaskChains(task, levels[task], built, shared.get(task, 0.0)))
    return out, missing


# ---------------------------------------------------------------- the estimator on one task


def metric_names(ps: Sequence[float] = FAST_PS) -> list[str]:
    return ["pass", *(f"fast_{float(p)}" for p in ps), "best"]


@dataclass
class TaskCurve:
    """One task's estimates at each budget of a grid; NaN where the task is left out (budget >= limit)."""

    task: str
    level: str
    included: np.ndarray  # bool, one a budget
    values: dict[str, np.ndarray]  # metric -> one a budget


def _task_seed(seed: int, task: str) -> list[int]:
    return [seed, int(hashlib.sha256(task.encode()).hexdigest()[:8], 16)]


def task_curve(task: TaskChains, budgets: np.ndarray, ps: Sequence[float] = FAST_PS, reps: int = REPS,
               seed: int = 0) -> TaskCurve:
    """Expected pass, fast_p and best speedup of what each budget buys on this task.

    When every chain costs the same c, a budget b buys k = floor((b - shared)/c) chains and the exact
    k-subset estimators of `search.stats` apply (so `--by samples` of a one-round run is pass@k itself).
    Otherwise the expectation over chain orders is taken over `reps` seeded random orders (the seed
    comes from the task id, so a report is reproducible); its error is at most 0.5/sqrt(reps) a task.
    """
    budgets = np.asarray(budgets, dtype=np.float64)
    names = metric_names(ps)
    included = budgets < task.limit - EPS * max(1.0, abs(task.limit))
    values = {name: np.full(budgets.shape, np.nan) for name in names}
    m = len(task.chains)
    if m == 0 or not included.any():
        return TaskCurve(task.task, task.level, included & (m > 0), values)
    cost = np.array([c.cost for c in task.chains], dtype=np.float64)
    ok = np.array([c.correct for c in task.chains])
    best = np.array([c.best_speedup for c in task.chains], dtype=np.float64)
    avail = budgets[included] - task.shared_cost
    if np.all(cost == cost[0]):
        c = cost[0]
        k = np.full(avail.shape, m) if c <= 0 else np.floor(avail / c + 1e-9).astype(np.int64)
        k = np.clip(np.where(avail < -EPS, 0, k), 0, m)
        table = {"pass": pass_at_all_k(m, int(ok.sum())), "best": expected_best_speedup_all_k(best)}
        for p in ps:
            table[f"fast_{float(p)}"] = pass_at_all_k(m, int((best > p).sum()))
        for name in names:
            full = np.concatenate([[0.0], table[name]])  # k = 0 buys nothing
            values[name][included] = full[k]
        return TaskCurve(task.task, task.level, included, values)
    rng = np.random.default_rng(_task_seed(seed, task.task))
    order = rng.permuted(np.tile(np.arange(m), (reps, 1)), axis=1)
    spent = np.cumsum(cost[order], axis=1)  # reps x m: the spend after each chain of each order
    got_ok = np.logical_or.accumulate(ok[order], axis=1)
    got_best = np.maximum.accumulate(best[order], axis=1)
    sums = {name: np.zeros(avail.shape) for name in names}
    chunk = max(1, 4_000_000 // (reps * m))  # budgets at a time, to bound the reps x m x budgets comparison
    for lo in range(0, len(avail), chunk):
        part = avail[lo:lo + chunk]
        bought = (spent[:, :, None] <= part[None, None, :] + EPS * np.maximum(1.0, np.abs(part))).sum(axis=1)
        last = np.maximum(bought - 1, 0)
        any_bought = bought > 0
        b = np.where(any_bought, np.take_along_axis(got_best, last, axis=1), 0.0)
        sums["pass"][lo:lo + chunk] = np.where(any_bought, np.take_along_axis(got_ok, last, axis=1), False).mean(axis=0)
        sums["best"][lo:lo + chunk] = b.mean(axis=0)
        for p in ps:
            sums[f"fast_{float(p)}"][lo:lo + chunk] = (b > p).mean(axis=0)
    for name in names:
        values[name][included] = sums[name]
    return TaskCurve(task.task, task.level, included, values)


# ---------------------------------------------------------------- over tasks


def budget_grid(tasks: Sequence[TaskChains], unit: str) -> np.ndarray:
    """The budgets a view is computed at: 1, 2, 3, ... samples, or 2^(j/16) tokens or seconds, from
    the cheapest chain any task can buy to the last budget at which some task is still included."""
    live = [t for t in tasks if t.chains]
    if not live:
        return np.empty(0)
    top = max(t.limit for t in live)
    if unit == "samples":
        return np.arange(1, max(1, math.ceil(top - 1e-9) - 1) + 1, dtype=np.float64)
    positive = [c.cost + t.shared_cost for t in live for c in t.chains if c.cost + t.shared_cost > 0]
    if not positive:
        return np.empty(0)
    j0 = math.floor(STEPS_PER_DOUBLING * math.log2(min(positive)) + 1e-9)
    j1 = math.ceil(STEPS_PER_DOUBLING * math.log2(top) - 1e-9) - 1
    return 2.0 ** (np.arange(j0, max(j0, j1) + 1) / STEPS_PER_DOUBLING)


def table_budgets(budgets: np.ndarray, unit: str) -> list[int]:
    """Indices of the grid a table shows: the powers of two on it, and its last point."""
    if len(budgets) == 0:
        return []
    picks = [i for i, b in enumerate(budgets) if abs(math.log2(b) - round(math.log2(b))) < 1e-9]
    if not picks or picks[-1] != len(budgets) - 1:
        picks.append(len(budgets) - 1)
    return picks


@dataclass
class CurveSummary:
    """Mean over the included tasks at each budget, with a percentile bootstrap interval over tasks."""

    budgets: np.ndarray
    tasks: np.ndarray  # included tasks at each budget
    total: int  # tasks with a chain
    mean: dict[str, np.ndarray]
    low: dict[str, np.ndarray]
    high: dict[str, np.ndarray]


def _weights(n_tasks: int, reps: int, seed: int) -> np.ndarray:
    """Bootstrap resamples of tasks as counts (reps x tasks): the same draw serves every budget and metric."""
    rng = np.random.default_rng([seed, n_tasks, 7])
    return rng.multinomial(n_tasks, np.full(n_tasks, 1.0 / n_tasks), size=reps).astype(np.float64)


def _resampled_means(curves: Sequence[TaskCurve], name: str, w: np.ndarray) -> np.ndarray:
    """reps x budgets: the mean over included tasks of each bootstrap resample (NaN where none is)."""
    mask = np.array([c.included for c in curves], dtype=np.float64)
    vals = np.nan_to_num(np.array([c.values[name] for c in curves]), nan=0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (w @ (vals * mask)) / (w @ mask)


def summarize_curves(curves: Sequence[TaskCurve], budgets: np.ndarray, ps: Sequence[float] = FAST_PS,
                     reps: int = REPS, seed: int = 0, alpha: float = 0.05) -> CurveSummary:
    names = metric_names(ps)
    g = len(budgets)
    if not curves or g == 0:
        empty = {name: np.full(g, np.nan) for name in names}
        return CurveSummary(budgets, np.zeros(g, dtype=np.int64), len(curves), empty, dict(empty), dict(empty))
    mask = np.array([c.included for c in curves])
    tasks = mask.sum(axis=0)
    w = _weights(len(curves), reps, seed)
    mean, low, high = {}, {}, {}
    for name in names:
        vals = np.array([c.values[name] for c in curves])
        with np.errstate(invalid="ignore"):
            mean[name] = np.where(tasks > 0, np.nansum(np.where(mask, vals, 0.0), axis=0) / np.maximum(tasks, 1), np.nan)
        rep = _resampled_means(curves, name, w)
        lo, hi = np.full(g, np.nan), np.full(g, np.nan)
        for j in np.flatnonzero(tasks > 0):
            col = rep[:, j][np.isfinite(rep[:, j])]
            if col.size:
                lo[j], hi[j] = np.quantile(col, [alpha / 2, 1 - alpha / 2])
        low[name], high[name] = lo, hi
    return CurveSummary(budgets, tasks, len(curves), mean, low, high)


# ---------------------------------------------------------------- one run against another


@dataclass(frozen=True)
class Overtake:
    """Where `other` gets ahead of `leader` (ahead at the smallest budget where they differ) for good,
    compared on the tasks both ran, at the budgets where every one of those tasks is included in both."""

    metric: str
    leader: str | None  # None: the two are equal at every budget compared
    other: str | None
    budget: float | None  # the first budget from which `other` stays ahead; None: it does not within the range
    low: float | None  # percentile interval of that budget over task resamples; None for high: beyond the range
    high: float | None
    crossing_share: float  # share of task resamples in which `other` gets ahead for good within the range
    lead_changes: int  # how often the lead changes hands within the range (ties skipped)
    tasks: int
    max_budget: float | None

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("metric", "leader", "other", "budget", "low", "high", "crossing_share",
                                              "lead_changes", "tasks", "max_budget")}


def _ahead_for_good(diff: np.ndarray) -> np.ndarray:
    """Per row of (other - leader) over the budgets, the first index at which other is strictly ahead and
    not behind at any larger budget, or -1."""
    never_behind_after = np.flip(np.logical_and.accumulate(np.flip(diff >= -EPS, axis=-1), axis=-1), axis=-1)
    good = (diff > EPS) & never_behind_after
    return np.where(good.any(axis=-1), np.argmax(good, axis=-1), -1)


def _lead_changes(diff: np.ndarray) -> int:
    signs = np.sign(diff[np.abs(diff) > EPS])
    return int(np.count_nonzero(signs[1:] != signs[:-1]))


def overtake(a: Sequence[TaskCurve], b: Sequence[TaskCurve], labels: tuple[str, str], budgets: np.ndarray,
             metric: str = "pass", reps: int = REPS, seed: int = 0, alpha: float = 0.05) -> Overtake:
    """The budget from which one run stays ahead of the other on `metric`, with a paired bootstrap interval
    (the same task resamples for both runs, since they ran the same tasks)."""
    by_a, by_b = {c.task: c for c in a}, {c.task: c for c in b}
    common = [t for t in by_a if t in by_b]
    none = Overtake(metric, None, None, None, None, None, 0.0, 0, len(common), None)
    if not common or len(budgets) == 0:
        return none
    ca, cb = [by_a[t] for t in common], [by_b[t] for t in common]
    both = np.all([c.included for c in ca + cb], axis=0)
    # the range: from the first budget up to the last one at which every common task is in both runs
    stop = int(np.argmin(both)) if not both.all() else len(budgets)
    if stop == 0:
        return none
    grid = budgets[:stop]
    va = np.array([c.values[metric][:stop] for c in ca]).mean(axis=0)
    vb = np.array([c.values[metric][:stop] for c in cb]).mean(axis=0)
    differ = np.flatnonzero(np.abs(va - vb) > EPS)
    if differ.size == 0:
        return Overtake(metric, None, None, None, None, None, 0.0, 0, len(common), float(grid[-1]))
    a_leads = va[differ[0]] > vb[differ[0]]
    leader, other = (labels[0], labels[1]) if a_leads else (labels[1], labels[0])
    sign = -1.0 if a_leads else 1.0  # other - leader = sign * (a - b)
    point = _ahead_for_good(sign * (va - vb))
    w = _weights(len(common), reps, seed)
    ra = _resampled_means(ca, metric, w)[:, :stop]
    rb = _resampled_means(cb, metric, w)[:, :stop]
    firsts = _ahead_for_good(sign * (ra - rb))
    crossing = np.where(firsts >= 0, grid[np.maximum(firsts, 0)], np.inf)
    lo, hi = np.quantile(crossing, [alpha / 2, 1 - alpha / 2], method="inverted_cdf")
    return Overtake(metric, leader, other, float(grid[point]) if point >= 0 else None,
                    float(lo) if np.isfinite(lo) else None, float(hi) if np.isfinite(hi) else None,
                    float(np.mean(firsts >= 0)), _lead_changes(va - vb), len(common), float(grid[-1]))


# ---------------------------------------------------------------- the adapter from a run folder's records


def _chained(config: Mapping[str, Any]) -> bool:
    """For runs recorded before samples named their chain: did rounds build on each other? (As the
    controller decides: more than one round, with a strategy whose later rounds differ per chain.)"""
    plan = config.get("plan") if isinstance(config.get("plan"), dict) else {}
    if (int_or_none(plan.get("rounds")) or 1) <= 1:
        return False
    from strategies import STRATEGIES

    cls = STRATEGIES.get(str(config.get("strategy")))
    return True if cls is None else not cls().shares_prompt(1)


def _step_key(step: Mapping[str, Any]) -> tuple[Any, Any] | None:
    return (step.get("step"), step["seed"]) if isinstance(step, Mapping) and int_or_none(step.get("seed")) is not None else None


def budget_records(records: Sequence[SampleRecord], config: Mapping[str, Any] | None = None,
                   correct: Callable[[SampleRecord], bool] | None = None,
                   timed: Callable[[SampleRecord], bool] | None = None) -> BudgetRecords:
    """The one adapter from a run folder's sample records (`search.store.SampleRecord`) and config.json to
    budget records.

    Conventions (those of `search.stats`): a `cancelled` record is not a sample; a duplicate is one, with
    the verdict it repeats and no oracle time; an incorrect sample has speedup 0. Oracle device seconds
    are the checks plus the timing (the record's `oracle_device_s`). The chain is the record's `chain`, else
    (runs from before samples named it) its position in its round when rounds built on each other and its
    sample index otherwise. A helper step (`agent_steps`) found on several records of a task is shared and
    paid once; one found on a single record is that sample's own cost. `correct` and `timed`: which samples
    count as correct, and as correct with a speed (default: the recorded status; `RunStats.correct` and
    `RunStats.timed` under another tolerance policy).
    """
    config = config or {}
    levels = {t["id"]: t.get("level") for t in config.get("tasks") or [] if isinstance(t, dict) and "id" in t}
    chained = _chained(config)
    plan = config.get("plan") if isinstance(config.get("plan"), dict) else {}
    n = int_or_none(plan.get("n"))
    seen: dict[str, Counter] = defaultdict(Counter)
    steps_of: dict[tuple[Any, Any], Mapping[str, Any]] = {}
    for r in records:
        for step in r.agent_steps:
            key = _step_key(step)
            if key is not None:
                seen[r.task][key] += 1
                steps_of[key] = step
    out = BudgetRecords()
    for task, counts in seen.items():
        for key, count in counts.items():
            if count > 1:
                step = steps_of[key]
                out.shared.append(SharedStep(task, int_or_none(step.get("tokens")) or 0, number_or_none(step.get("generation_s"))))
    for r in records:
        if r.status == "cancelled":
            continue
        task = r.task
        own = [s for s in r.agent_steps if isinstance(s, Mapping) and "tokens" in s
               and (_step_key(s) is None or seen[task][_step_key(s)] == 1)]
        generation = number_or_none(r.generation_s)
        own_s = [number_or_none(s.get("generation_s")) if int_or_none(s.get("tokens")) else 0.0 for s in own]  # nothing made: no time
        if generation is not None:
            generation = None if any(x is None for x in own_s) else generation + sum(own_s)
        chain = r.chain
        if chain is None:
            chain = (r.sample_index % n if n else r.sample_index) if chained else r.sample_index
        if r.status in ON_DEVICE and r.duplicate_of is None and r.verify_s is None and r.verdict.time_s is None:
            out.unclocked += 1
        out.samples.append(BudgetSample(
            task=task, level=level_of(task, levels.get(task)), chain=chain, round=r.round,
            correct=correct(r) if correct else r.correct,
            speedup_vs_eager=(r.speedup_vs_eager or 0.0) if (timed(r) if timed else r.correct) else 0.0,
            tokens=r.tokens_out + sum(int_or_none(s.get("tokens")) or 0 for s in own),
            generation_s=generation, oracle_device_s=r.oracle_device_s))
    return out
