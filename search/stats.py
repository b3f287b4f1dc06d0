"""Statistics of a best-of-n run: pass@k, fast_p@k, the expected best speedup, bootstrap intervals, cost.

Every estimator here uses all n recorded samples of a task, not only the first k: drawing n and asking
"what would k have given?" over every k-subset is unbiased and has far less variance than looking at
one prefix. The formulas are the ones of Chen et al. (2021, pass@k) and KernelBench (fast_p), and the
order-statistics form of an expected maximum.

Conventions (kept in one place so the report and the tests agree):
- A `cancelled` record was never judged (its task had stopped), and an `unsupported` one could not be
  judged here (e.g. a Triton kernel without Triton installed): neither says anything about the model, so
  neither is a sample. Both count toward cost (their tokens were generated) but not toward n
  (`oracle.verdict.NOT_JUDGED`).
- A duplicate (`duplicate_of` set) is a real draw from the model that happened to repeat an earlier
  kernel: it counts as a sample with the verdict of the kernel it repeats.
- An incorrect sample has speedup 0; so does a correct one whose timing is missing (unknown is not fast).
- Samples are ordered by their index (round * n + chain, from 0); where a report shows a sample to people
  it counts from 1, and every field that does says so in its name (`first_correct_sample_from_1`).
- A task with fewer than k samples (early stop, an unfinished run) is left out of the mean at that k,
  and `tasks_at_k` says how many were used. Early-stopped tasks are the successful ones, so at k above
  their sample count the mean over the remaining tasks is pessimistic; the report says so.

At equal budget (`kernelsearch report --by samples|tokens|gpu-seconds`, computed in `search.budget`):
- The unit resampled is the chain: the rounds of one refinement or agent chain build on each other, so
  they are bought together; a sample that starts afresh (zero-shot, or any one-round run) is a chain of
  one round. A chain's cost is the sum of its rounds' costs: 1 a sample, its generated tokens (helper
  completions of that round included), or its generation seconds plus oracle device seconds (checks
  and timing; a duplicate ran nothing on the oracle). A helper completion every chain of a task shares
  is paid once per task, before the first chain.
- A budget b per task buys whole chains in a uniformly random order of the task's m recorded chains,
  as long as the next one fits: if c_1, c_2, ... are the costs in that order, it buys the first T chains
  with c_1 + ... + c_T <= b < c_1 + ... + c_{T+1}. pass(b) is the probability, over orders, that one of
  them holds a correct round; fast_p(b) that one holds a correct round faster than eager by more than p;
  best(b) the expected best speedup among them (0 when none is correct). The per-task values are
  averaged over tasks, with percentile bootstrap intervals from resampling tasks.
- Why it is unbiased: the m chains are i.i.d. draws of what the strategy does on the task, so a random
  order of them is distributed as the first m chains of a fresh run, and a budget that stops within
  those m chains buys exactly what a fresh run spending b would buy. It stops within them when b is
  below S + c_min (S: the task's whole recorded spend; c_min: its cheapest chain, the least another
  chain could cost); above that a task is left out, as a task with n < k is for pass@k. Near that
  limit the tasks kept are the ones that spent more, which can bias the mean there; the report marks
  the budgets where some task is left out.
- When every chain of a task costs the same c (a one-round run by samples), b buys k = floor(b/c)
  chains and the value is exactly pass@k, fast_p@k and the expected best of k above. Otherwise the
  expectation over orders is taken over 2000 seeded random orders (a Monte Carlo standard error of at
  most 0.5/sqrt(2000) = 0.011 per task, less in a mean over tasks).
- `--compare`: on the tasks two runs share and the budgets at which all of them are kept in both, the
  run ahead at the smallest budget where the two differ is the leader; the other overtakes it at the
  first budget of the grid from which it stays ahead (its mean strictly higher there and not lower at any
  larger budget compared), so a crossing back and forth on noise at small budgets is not an overtaking;
  how often the lead changes hands is reported beside it. The interval is the percentile interval of that
  budget over paired task resamples (a resample in which it does not get ahead for good counts as beyond
  the range), with the share of resamples in which it does.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from oracle.tolerance import DEFAULT_POLICY
from oracle.verdict import CANCELLED, UNSUPPORTED
from search.store import SampleRecord

FAST_PS = (0.0, 1.0, 1.5, 2.0)


# ---------------------------------------------------------------- estimators


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples, drawn without replacement from n of which c are
    correct, is correct: 1 - C(n-c, k)/C(n, k).

    Computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i): the binomials overflow floats already for n in the
    hundreds, the product of terms in [0, 1] does not.
    """
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n (k={k}, n={n})")
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n (c={c}, n={n})")
    if n - c < k:
        return 1.0  # every k-subset holds a correct sample
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def fast_p_at_k(n: int, f: int, k: int) -> float:
    """fast_p@k (KernelBench): probability that one of k samples is correct AND faster than the
    baseline by more than p. The estimator is pass@k's with f (samples that are correct and have
    speedup > p) in place of c; it has its own name so call sites say which count they pass.
    """
    return pass_at_k(n, f, k)


def expected_best_speedup(speedups: Sequence[float], n: int, k: int) -> float:
    """Expected maximum speedup among k samples drawn without replacement from the n recorded ones
    (incorrect samples at 0), which is what best-of-k would have delivered on average.

    Sorted ascending, s_(i) is the maximum of a k-subset in C(i-1, k-1) of the C(n, k) subsets, so
    E[max] = sum_i s_(i) C(i-1, k-1)/C(n, k), unbiased over all n. The weights w_i are built from
    w_n = k/n and w_{i-1} = w_i (i-k)/(i-1), never forming the binomials themselves.
    """
    s = np.sort(np.asarray(speedups, dtype=np.float64))
    if len(s) != n:
        raise ValueError(f"expected_best_speedup got {len(s)} speedups for n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"expected_best_speedup needs 1 <= k <= n (k={k}, n={n})")
    i = np.arange(n, k - 1, -1, dtype=np.float64)  # n, n-1, ..., k
    ratios = np.ones_like(i)
    ratios[1:] = (i[:-1] - k) / (i[:-1] - 1)  # w_{i-1}/w_i, for i = n..k+1
    weights = (k / n) * np.cumprod(ratios)  # w_n, w_{n-1}, ..., w_k
    return float(np.dot(weights, s[k - 1:][::-1]))


def pass_at_all_k(n: int, c: int) -> np.ndarray:
    """pass@k for every k = 1..n at once (entry k-1), the same product as `pass_at_k` laid out as an
    n x c table: a report needs every k of every task, and one numpy call a task keeps a run of
    hundreds of tasks at n in the hundreds well under a second."""
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n (c={c}, n={n})")
    k = np.arange(1, n + 1, dtype=np.float64)
    if c == 0:
        return np.zeros(n)
    terms = 1.0 - k[:, None] / np.arange(n - c + 1, n + 1, dtype=np.float64)[None, :]
    return np.where(k > n - c, 1.0, 1.0 - np.prod(terms, axis=1))


def expected_best_speedup_all_k(speedups: Sequence[float]) -> np.ndarray:
    """`expected_best_speedup` for every k = 1..n at once (entry k-1).

    The weights of all ks come from one recurrence over k, vectorised over the order statistics i:
    W_1(i) = 1/n and W_k(i) = W_{k-1}(i) (i-k+1)/(k-1) k/(n-k+1), which is C(i-1, k-1)/C(n, k)
    without a binomial (it reaches 0 at i = k-1 and stays there).
    """
    s = np.sort(np.asarray(speedups, dtype=np.float64))
    n = len(s)
    if n == 0:
        return np.empty(0)
    i = np.arange(1, n + 1, dtype=np.float64)
    if n <= 2048:  # the whole n x n table of weights in one cumulative product
        k = np.arange(2, n + 1, dtype=np.float64)[:, None]
        factors = np.vstack([np.full((1, n), 1.0 / n), (i[None, :] - k + 1) / (k - 1) * k / (n - k + 1)])
        return np.maximum(np.cumprod(factors, axis=0), 0.0) @ s
    out = np.empty(n)  # row by row, so memory stays O(n)
    w = np.full(n, 1.0 / n)
    for k in range(1, n + 1):
        if k > 1:
            w = np.maximum(w * (i - k + 1) / (k - 1) * k / (n - k + 1), 0.0)
        out[k - 1] = float(np.dot(w, s))
    return out


def _expected_best(n: int, speedups: Sequence[float], k: int) -> float:
    """`expected_best_speedup` in curve's (n, x, k) argument order."""
    return expected_best_speedup(speedups, n, k)


# scalar estimator -> the same estimator for every k = 1..n at once, which curve uses when it can
_ALL_K: dict[Callable, Callable[[int, Any], np.ndarray]] = {
    pass_at_k: pass_at_all_k,
    fast_p_at_k: pass_at_all_k,
    _expected_best: lambda n, s: expected_best_speedup_all_k(s),
}


def curve(per_task_counts: Iterable[tuple[int, Any]], ks: Iterable[int],
          estimator: Callable[[int, Any, int], float] = pass_at_k) -> dict[int, dict[str, Any]]:
    """Mean over tasks of a per-task estimator at every k, the way a benchmark reports pass@k.

    `per_task_counts` holds one (n, x) a task (x = c for pass@k, f for fast_p@k, or the speedup list
    with `estimator=lambda n, s, k: expected_best_speedup(s, n, k)`). A task with n < k has no
    unbiased value at k, so it is left out there rather than counted as a failure; each point says
    how many tasks it used and how many it left out, so a thinning tail is visible.
    Returns {k: {"mean": float | None, "tasks": used, "left_out": left out}}.
    """
    items = list(per_task_counts)
    ks = list(ks)
    if any(k < 1 for k in ks):
        raise ValueError(f"curve needs every k >= 1 (got {min(ks)})")
    all_k = _ALL_K.get(estimator)
    if all_k is not None:
        top = max(ks, default=0)
        sums, counts = np.zeros(top + 1), np.zeros(top + 1, dtype=np.int64)
        for n, x in items:
            m = min(n, top)
            if m:
                sums[1:m + 1] += all_k(n, x)[:m]
                counts[1:m + 1] += 1
        return {k: {"mean": float(sums[k] / counts[k]) if counts[k] else None, "tasks": int(counts[k]),
                    "left_out": len(items) - int(counts[k])} for k in ks}
    out: dict[int, dict[str, Any]] = {}
    for k in ks:
        values = [estimator(n, x, k) for n, x in items if n >= k]
        out[k] = {"mean": float(np.mean(values)) if values else None, "tasks": len(values),
                  "left_out": len(items) - len(values)}
    return out


def bootstrap_ci(per_task_values: Sequence[float], reps: int = 2000, seed: int = 0,
                 alpha: float = 0.05) -> tuple[float, float]:
    """Percentile (1 - alpha) interval of the mean over tasks, resampling tasks with replacement.

    Tasks are the unit that varies between benchmarks (the samples within a task are already averaged
    by the estimator), so the interval says how much the mean would move on another draw of tasks
    like these. Seeded, so a report is reproducible.
    """
    values = np.asarray(per_task_values, dtype=np.float64)
    if values.size == 0:
        raise ValueError("bootstrap_ci needs at least one task")
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, values.size, size=(reps, values.size))].mean(axis=1)
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(low), float(high)


def powers_of_two(n: int) -> list[int]:
    """1, 2, 4, ... up to n, and n itself: the ks a table or an interval is shown at."""
    ks = [1 << i for i in range(max(n, 1).bit_length()) if 1 << i <= n]
    if n >= 1 and ks[-1] != n:
        ks.append(n)
    return ks


# ---------------------------------------------------------------- one run


def number_or_none(x: Any) -> float | None:
    """A finite number from a record field, or None (missing, null, a string, NaN)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(x) else None


def int_or_none(x: Any) -> int | None:
    return int(x) if isinstance(x, int) and not isinstance(x, bool) else None


def level_of(task_id: str, config_level: Any = None) -> str:
    """The level a task is broken down under: the config's task level, else the `levelN/` prefix of
    its id, else whatever prefix it has (`builtin`), else `other`."""
    if int_or_none(config_level) is not None:
        return f"level{config_level}"
    m = re.match(r"^(level\d+)/", task_id)
    if m:
        return m.group(1)
    return task_id.split("/", 1)[0] if "/" in task_id else "other"


def _fmt_p(p: float) -> str:
    return str(float(p))


@dataclass
class TaskStats:
    """What one task's samples add up to."""

    task: str
    level: str
    samples: int = 0  # judged samples: every record but `cancelled` and `unsupported`
    correct: int = 0
    status_counts: dict[str, int] = field(default_factory=dict)
    duplicates: int = 0
    cancelled: int = 0
    unsupported: int = 0
    first_correct_index: int | None = None  # the first correct sample's index (from 0)
    speedups_vs_eager: list[float] = field(default_factory=list)  # one a judged sample, 0 if not correct
    speedups_vs_compile: list[float] = field(default_factory=list)
    best_speedup_vs_eager: float | None = None  # the best/ verdict if there is one, else best sample
    best_speedup_vs_compile: float | None = None
    best_retimed: bool = False
    tokens: int = 0
    device_s: float = 0.0

    @property
    def first_correct_sample_from_1(self) -> int | None:
        """The first correct sample, counted from 1 as tables show it (#1 is the first sample)."""
        return None if self.first_correct_index is None else self.first_correct_index + 1

    def fast(self, p: float, vs: str = "eager") -> int:
        speedups = self.speedups_vs_eager if vs == "eager" else self.speedups_vs_compile
        return sum(1 for s in speedups if s > p)

    @property
    def best_sample_speedup_vs_eager(self) -> float | None:
        return max((s for s in self.speedups_vs_eager if s > 0), default=None)

    @property
    def best_sample_speedup_vs_compile(self) -> float | None:
        return max((s for s in self.speedups_vs_compile if s > 0), default=None)

    def to_json(self, ps: Sequence[float] = FAST_PS, compile_available: bool = True) -> dict[str, Any]:
        return {
            "task": self.task, "level": self.level, "samples": self.samples, "correct": self.correct,
            "status_counts": dict(self.status_counts), "duplicates": self.duplicates, "cancelled": self.cancelled,
            "unsupported": self.unsupported, "first_correct_sample_from_1": self.first_correct_sample_from_1,
            "pass_at_1": self.correct / self.samples if self.samples else None,
            "fast": {_fmt_p(p): self.fast(p) for p in ps},
            "fast_vs_compile": {_fmt_p(p): self.fast(p, "compile") for p in ps} if compile_available else None,
            "best_speedup_vs_eager": self.best_speedup_vs_eager,
            "best_speedup_vs_compile": self.best_speedup_vs_compile,
            "best_retimed": self.best_retimed,
            "best_sample_speedup_vs_eager": self.best_sample_speedup_vs_eager,
            "best_sample_speedup_vs_compile": self.best_sample_speedup_vs_compile,
            "tokens": self.tokens, "device_s": self.device_s,
        }


def summarize(tasks: Sequence[TaskStats], ps: Sequence[float] = FAST_PS, compile_available: bool = True) -> dict[str, Any]:
    """pass@k, fast_p@k and the expected best speedup at every k = 1..n for a set of tasks (a run, one
    level, one strategy), with n the most samples any of them has. Keys are strings so it is JSON."""
    n = max((t.samples for t in tasks), default=0)
    ks = list(range(1, n + 1))
    passes = curve([(t.samples, t.correct) for t in tasks], ks)

    def fast_block(vs: str) -> dict[str, dict[str, float | None]]:
        return {_fmt_p(p): {str(k): v["mean"] for k, v in
                            curve([(t.samples, t.fast(p, vs)) for t in tasks], ks, fast_p_at_k).items()}
                for p in ps}

    def best_block(vs: str) -> dict[str, float | None]:
        items = [(t.samples, t.speedups_vs_eager if vs == "eager" else t.speedups_vs_compile) for t in tasks]
        return {str(k): v["mean"] for k, v in curve(items, ks, _expected_best).items()}

    return {
        "n": n, "tasks": len(tasks), "tasks_with_samples": sum(1 for t in tasks if t.samples),
        "samples": sum(t.samples for t in tasks), "correct": sum(t.correct for t in tasks),
        "pass_at_k": {str(k): v["mean"] for k, v in passes.items()},
        "tasks_at_k": {str(k): v["tasks"] for k, v in passes.items()},
        "fast_p_at_k": fast_block("eager"),
        "fast_p_at_k_vs_compile": fast_block("compile") if compile_available else None,
        "expected_best_speedup": best_block("eager"),
        "expected_best_speedup_vs_compile": best_block("compile") if compile_available else None,
    }


class RunStats:
    """Everything `kernelsearch report` says about one run, from its sample records and config.

    `best` maps a task id to its best/ verdict (optional): the per-task best speedup is that number when
    there is one, re-timed where a single timing of the best of n is biased upward (`retimed`).
    """

    def __init__(self, records: Sequence[SampleRecord], config: dict[str, Any] | None = None,
                 best: dict[str, dict[str, Any]] | None = None, ps: Sequence[float] = FAST_PS,
                 reps: int = 2000, seed: int = 0, alpha: float = 0.05, tolerance: str | None = None) -> None:
        self.config = config or {}
        # The tolerance policy samples count as correct under: the run's own, or another one asked for
        # (`report --tolerance`), answered from what each verdict recorded (its `passes`), re-running nothing.
        self.run_tolerance = str(self.config.get("tolerance") or DEFAULT_POLICY)
        self.tolerance = tolerance or self.run_tolerance
        if self.tolerance != self.run_tolerance and "tolerance" not in self.config:
            raise ValueError(f"the run was recorded before verdicts listed the tolerance policies they pass: it can "
                             f"only be counted under its own policy ({self.run_tolerance})")
        self._json: dict[str, Any] | None = None
        self.records = list(records)
        self.ps = tuple(ps)
        plan = self.config.get("plan") if isinstance(self.config.get("plan"), dict) else {}
        self.plan = plan
        self.strategy = self.config.get("strategy")
        levels = {t["id"]: t.get("level") for t in self.config.get("tasks") or [] if isinstance(t, dict) and "id" in t}
        # a torch.compile baseline: asked for (None means the oracle's default, on cuda only) or present in the data
        baseline = self.config.get("compile_baseline")
        self.compile_available = baseline is True or (baseline is None and self.config.get("device") == "cuda") or any(
            r.speedup_vs_compile is not None or r.compile_ms is not None for r in self.records)

        self.tasks: dict[str, TaskStats] = {tid: TaskStats(tid, level_of(tid, lvl)) for tid, lvl in levels.items()}
        by_strategy: dict[str, dict[str, TaskStats]] = defaultdict(dict)
        for r in sorted(self.records, key=lambda r: r.sample_index):
            tid = r.task
            if tid not in self.tasks:
                self.tasks[tid] = TaskStats(tid, level_of(tid, levels.get(tid)))
            strategy = str(r.strategy or self.strategy or "unknown")
            if tid not in by_strategy[strategy]:
                by_strategy[strategy][tid] = TaskStats(tid, self.tasks[tid].level)
            for t in (self.tasks[tid], by_strategy[strategy][tid]):
                self._add(t, r, self.correct(r), self.timed(r))
        for tid, t in self.tasks.items():
            verdict = (best or {}).get(tid)
            if isinstance(verdict, dict) and self._passes(verdict) and number_or_none(verdict.get("speedup_vs_eager")):
                t.best_speedup_vs_eager = number_or_none(verdict.get("speedup_vs_eager"))
                t.best_speedup_vs_compile = number_or_none(verdict.get("speedup_vs_compile"))
                t.best_retimed = verdict.get("retimed") is not False  # False: its own timing stood (rule 18)
            else:
                t.best_speedup_vs_eager = t.best_sample_speedup_vs_eager
                t.best_speedup_vs_compile = t.best_sample_speedup_vs_compile
        self.by_strategy = {s: list(ts.values()) for s, ts in sorted(by_strategy.items())}

        task_list = list(self.tasks.values())
        self.summary = summarize(task_list, self.ps, self.compile_available)
        self.n = self.summary["n"]
        by_level: dict[str, list[TaskStats]] = defaultdict(list)
        for t in task_list:
            by_level[t.level].append(t)
        self.by_level = dict(sorted(by_level.items()))
        self.ci: dict[str, list[float]] = {}
        per_task = [pass_at_all_k(t.samples, t.correct) for t in task_list if t.samples]
        for k in powers_of_two(self.n):
            values = [v[k - 1] for v in per_task if len(v) >= k]
            self.ci[str(k)] = list(bootstrap_ci(values, reps=reps, seed=seed, alpha=alpha))
        self.cost = self._cost()

    def correct(self, r: SampleRecord) -> bool:
        """Whether the sample counts as correct under this report's tolerance policy."""
        if self.tolerance == self.run_tolerance:
            return r.correct
        return r.verdict is not None and self.tolerance in r.verdict.passes

    def timed(self, r: SampleRecord) -> bool:
        """Correct under this report's policy and timed: one a policy other than the run's own passes but the
        run's failed was checked to the end, never timed, so its speedup is unknown (counted as 0)."""
        return self.correct(r) and r.correct

    def _passes(self, verdict: dict[str, Any]) -> bool:
        if verdict.get("status") != "correct":
            return False
        return self.tolerance == self.run_tolerance or self.tolerance in (verdict.get("passes") or [])

    @staticmethod
    def _add(t: TaskStats, r: SampleRecord, correct: bool | None = None, timed: bool | None = None) -> None:
        """Count one record into a task's figures; `correct` and `timed` as `RunStats.correct` and
        `RunStats.timed` say (default: the recorded status, as the live view counts)."""
        status = r.status
        t.status_counts[status] = t.status_counts.get(status, 0) + 1
        t.tokens += r.tokens_out
        t.device_s += number_or_none(r.oracle_device_s) or 0.0
        if not r.judged:
            t.cancelled += status == CANCELLED
            t.unsupported += status == UNSUPPORTED
            return
        t.samples += 1
        if r.duplicate_of is not None:
            t.duplicates += 1
        ok = r.correct if correct is None else correct
        timed = ok if timed is None else timed
        t.speedups_vs_eager.append((r.speedup_vs_eager or 0.0) if timed else 0.0)
        t.speedups_vs_compile.append((r.speedup_vs_compile or 0.0) if timed else 0.0)
        if ok:
            t.correct += 1
            if t.first_correct_index is None or r.sample_index < t.first_correct_index:
                t.first_correct_index = r.sample_index

    def _cost(self) -> dict[str, Any]:
        """What the run spent, and what it bought per unit spent."""
        tokens = sum(r.tokens_out for r in self.records)
        prompt_tokens = sum(r.tokens_in for r in self.records)
        device_s = sum(number_or_none(r.oracle_device_s) or 0.0 for r in self.records)
        build_s = sum(r.build_s or 0.0 for r in self.records)
        verify_s = sum(r.verify_s or 0.0 for r in self.records)
        generation_s = sum(number_or_none(r.generation_s) or 0.0 for r in self.records)
        times = [t for t in (number_or_none(r.recorded_at) for r in self.records) if t]
        started = number_or_none(self.config.get("started_at"))
        wall_s = None
        if times:
            start = started if started is not None and started <= min(times) else min(times)
            wall_s = max(times) - start
        correct = sum(1 for r in self.records if self.correct(r))
        unique = len({r.hash or id(r) for r in self.records if self.correct(r) and r.duplicate_of is None})
        return {
            "tokens": tokens, "prompt_tokens": prompt_tokens, "device_s": device_s, "build_cpu_s": build_s,
            "verify_s": verify_s, "generation_s": generation_s, "wall_s": wall_s, "correct": correct,
            "correct_unique": unique,
            "correct_per_1k_tokens": correct / tokens * 1000 if tokens else None,
            "correct_per_device_minute": correct / (device_s / 60) if device_s else None,
        }

    @property
    def left_out(self) -> dict[str, int]:
        """k -> tasks with samples, but fewer than k, so left out at that k; only the k where some are.
        (Tasks with no samples at all are left out everywhere and counted in `unsampled` instead.)"""
        total = self.summary["tasks_with_samples"]
        return {k: total - v for k, v in self.summary["tasks_at_k"].items() if v < total}

    @property
    def unsampled(self) -> list[str]:
        """Tasks in the config with no judged sample (not reached yet, or all cancelled)."""
        return [tid for tid, t in self.tasks.items() if t.samples == 0]

    def to_json(self) -> dict[str, Any]:
        """The run as JSON (computed once; the breakdowns are the costly part)."""
        if self._json is None:
            self._json = self._to_json()
        return self._json

    def _to_json(self) -> dict[str, Any]:
        s = self.summary
        n_planned = None
        if int_or_none(self.plan.get("n")) is not None:
            n_planned = self.plan["n"] * (int_or_none(self.plan.get("rounds")) or 1)

        def breakdown(groups: dict[str, list[TaskStats]]) -> dict[str, Any]:
            return {g: summarize(ts, self.ps, self.compile_available) for g, ts in groups.items()}

        return {
            "strategy": self.strategy, "generator": self.config.get("generator"), "device": self.config.get("device"),
            "tolerance": self.tolerance, "run_tolerance": self.run_tolerance,
            "plan": self.plan, "n": self.n, "n_planned": n_planned,
            "tasks_total": s["tasks"], "tasks_with_samples": s["tasks_with_samples"], "tasks_unsampled": self.unsampled,
            "samples": s["samples"],
            "correct": s["correct"], "cancelled": sum(t.cancelled for t in self.tasks.values()),
            "unsupported": sum(t.unsupported for t in self.tasks.values()),
            "duplicates": sum(t.duplicates for t in self.tasks.values()),
            "pass_at_k": s["pass_at_k"], "pass_at_k_ci": self.ci, "tasks_at_k": s["tasks_at_k"],
            "fast_p_at_k": s["fast_p_at_k"], "fast_p_at_k_vs_compile": s["fast_p_at_k_vs_compile"],
            "expected_best_speedup": s["expected_best_speedup"],
            "expected_best_speedup_vs_compile": s["expected_best_speedup_vs_compile"],
            "by_level": breakdown(self.by_level), "by_strategy": breakdown(self.by_strategy),
            "tasks": {tid: t.to_json(self.ps, self.compile_available) for tid, t in self.tasks.items()},
            "cost": self.cost,
        }
