"""Correctness at equal budget (search.budget, `kernelsearch report --by/--compare`).

Run folders written here whose answers are known in closed form; the estimator against enumeration of
every chain order; its bias checked by simulation against direct subsampling of a known strategy (fixed
seeds: the numbers are the same on every machine); the adapter from records; and what the controller
and the generators record for it.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from search.budget import (BudgetRecords, BudgetSample, Chain, TaskChains, budget_grid, budget_records, chains_by_task,
                           overtake, summarize_curves, table_budgets, task_curve)
from search.generators.base import Completion, SampleRequest, timed
from search.generators.replay import ReplayGenerator
from search.report import report
from search.stats import RunStats, expected_best_speedup, pass_at_k
from search.store import SampleRecord

ROOT = Path(__file__).resolve().parent.parent
LEVEL1 = [f"level1/{i}_Op" for i in range(1, 4)]
LEVEL2 = ["level2/9_Fused"]
TASKS = [{"id": t, "level": int(t[5])} for t in LEVEL1 + LEVEL2]


# ---------------------------------------------------------------- constructed run folders


def record(task, chain, rnd, status, n, eager=None, tokens=100, generation_s=2.0, verify_s=0.5, time_s=0.25,
           chain_field=True, **extra):
    r = {"task": task, "strategy": "x", "round": rnd, "sample": chain if rnd is not None else chain,
         "sample_number": rnd * n + chain, "status": status, "message": "", "hash": f"h{task}{rnd}{chain}",
         "duplicate_of": None, "speedup_vs_eager": eager, "tokens": tokens, "prompt_tokens": 50,
         "generation_s": generation_s, "verify_s": verify_s, "time_s": time_s if status == "correct" else None, **extra}
    if chain_field:
        r["chain"] = chain
    return r


def records_of(rows: list[dict]) -> list[SampleRecord]:
    """Flat records as a run of before `SampleRecord` wrote them, read the way its samples.jsonl is."""
    return [SampleRecord.from_json(r) for r in rows]


def write_run(root: Path, strategy: str, n: int, rounds: int, records: list[dict]) -> Path:
    root.mkdir(parents=True)
    config = {"plan": {"n": n, "rounds": rounds, "target_speedup": 1.0, "early_stop": False, "seed": 0},
              "strategy": strategy, "generator": "replay:x.jsonl", "device": "cpu", "tasks": TASKS}
    (root / "config.json").write_text(json.dumps(config))
    (root / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return root


CHAINS, ROUND_TOKENS = 4, 100
N_ZS, C_ZS, ZS_TOKENS = 10, 3, 200
ZS_SPEEDUPS = [2.0, 1.0, 0.5]  # the three correct samples of every task


@pytest.fixture
def refine_run(tmp_path) -> Path:
    """Every chain of 4 rounds fails twice and succeeds at round 3 (1.5x eager), where it stops:
    4 chains of 3 rounds a task, 100 tokens and 1 + 0.5 s a round."""
    records = [record(t, c, r, "correct" if r == 2 else "incorrect", CHAINS, 1.5 if r == 2 else None,
                      tokens=ROUND_TOKENS, generation_s=1.0, verify_s=0.5, time_s=0.0)
               for t in LEVEL1 + LEVEL2 for c in range(CHAINS) for r in range(3)]
    return write_run(tmp_path / "refine", "refine", CHAINS, 4, records)


@pytest.fixture
def zero_shot_run(tmp_path) -> Path:
    """Each sample succeeds with p = 0.3: 3 correct of 10 a task (2x, 1x, 0.5x eager), 200 tokens and
    3 + 1 s a sample."""
    records = []
    for t in LEVEL1 + LEVEL2:
        for i in range(N_ZS):
            ok = i < C_ZS
            records.append(record(t, i, 0, "correct" if ok else "incorrect", N_ZS, ZS_SPEEDUPS[i] if ok else None,
                                  tokens=ZS_TOKENS, generation_s=3.0, verify_s=1.0, time_s=0.0))
    return write_run(tmp_path / "zero-shot", "zero-shot", N_ZS, 1, records)


def quiet() -> Console:
    return Console(file=io.StringIO(), width=200)


def brute_best(speedups: list[float], k: int) -> float:
    subsets = list(itertools.combinations(speedups, k))
    return sum(max(s) for s in subsets) / len(subsets)


def series(block: dict, name: str) -> list[float | None]:
    return block["all"][name]["mean"]


def test_closed_form_by_samples(refine_run, zero_shot_run):
    out = report([refine_run, zero_shot_run], quiet(), as_json=False, csv_path=None, plot_path=None, by="samples",
                 compare=True)
    view = out["budget"]
    assert view["by"] == "samples"
    refine, zs = view["runs"]
    # refine: a chain costs 3 samples; 4 chains and 12 samples a task, so budgets up to 12 + 3 - 1 are estimated
    assert view["budgets"] == list(range(1, 15))
    assert (refine["tasks"], refine["chains"], zs["chains"]) == (4, 16, 40)
    for b, p in zip(view["budgets"], series(refine, "pass")):
        assert p == (0.0 if b < 3 else 1.0)
    for b, e in zip(view["budgets"], series(refine, "best")):
        assert e == (0.0 if b < 3 else 1.5)
    # zero-shot: every sample a chain of one, so exactly pass@b, fast_1.0@b and E[best of b], to b = n
    for b, p, f, e, tasks in zip(view["budgets"], series(zs, "pass"), series(zs, "fast_1.0"), series(zs, "best"),
                                 zs["all"]["tasks"]):
        if b <= N_ZS:
            assert p == pytest.approx(1 - math.comb(N_ZS - C_ZS, b) / math.comb(N_ZS, b), abs=1e-12)
            assert f == pytest.approx(b / N_ZS, abs=1e-12)  # only the 2x sample is faster than 1.0x
            assert e == pytest.approx(brute_best(ZS_SPEEDUPS + [0.0] * (N_ZS - C_ZS), b), abs=1e-12)
            assert tasks == 4
        else:
            assert p is None and tasks == 0  # beyond what the run recorded: left out
    # tasks identical within a run: the bootstrap has nothing to vary
    assert zs["all"]["pass"]["low"][0] == pytest.approx(0.3) and zs["all"]["pass"]["high"][0] == pytest.approx(0.3)
    # the per-level split holds the same numbers for level1 (3 tasks) and level2 (1 task)
    assert set(refine["by_level"]) == {"level1", "level2"}
    assert refine["by_level"]["level2"]["pass"]["mean"][:4] == [0.0, 0.0, 1.0, 1.0]
    assert zs["by_level"]["level1"]["tasks"][0] == 3
    # zero-shot leads at 1 and 2 samples; refine overtakes at 3, in every task resample
    by_metric = {c["metric"]: c for c in view["compare"]}
    passed = by_metric["pass"]
    assert (passed["leader"], passed["other"], passed["budget"], passed["low"], passed["high"]) == \
        ("zero-shot", "refine", 3.0, 3.0, 3.0)
    assert passed["crossing_share"] == 1.0 and passed["tasks"] == 4 and passed["max_budget"] == 10.0
    assert by_metric["fast_1.0"]["budget"] == 3.0


def test_closed_form_by_tokens_and_gpu_seconds(refine_run, zero_shot_run):
    console = quiet()
    out = report([refine_run, zero_shot_run], console, as_json=True, csv_path=None, plot_path=None, by="tokens",
                 compare=True)
    assert json.loads(console.file.getvalue().rstrip("\n").split("\n")[-1])["budget"]["by"] == "tokens"
    view = out["budget"]
    budgets = np.array(view["budgets"])
    assert np.allclose(np.diff(np.log2(budgets)), 1 / 16)  # 16 points a doubling
    assert budgets[0] <= 3 * ROUND_TOKENS and budgets[-1] < 4 * ZS_TOKENS * N_ZS  # to the last included budget
    refine, zs = view["runs"]
    for b, p, tasks in zip(budgets, series(refine, "pass"), refine["all"]["tasks"]):
        if b < CHAINS * 3 * ROUND_TOKENS + 3 * ROUND_TOKENS:
            assert p == (0.0 if b < 3 * ROUND_TOKENS else 1.0)
        else:
            assert tasks == 0
    for b, p in zip(budgets, series(zs, "pass")):
        k = int(b // ZS_TOKENS)
        if k <= N_ZS:
            assert p == pytest.approx(pass_at_k(N_ZS, C_ZS, k) if k else 0.0, abs=1e-12)
    # zero-shot's first sample fits at 200 tokens, refine's first chain at 300: the first grid point past 300
    passed = next(c for c in view["compare"] if c["metric"] == "pass")
    first_past = 2 ** (math.ceil(16 * math.log2(300)) / 16)
    assert passed["leader"] == "zero-shot" and passed["budget"] == pytest.approx(first_past)
    assert passed["low"] == pytest.approx(first_past) and passed["high"] == pytest.approx(first_past)

    out = report([refine_run, zero_shot_run], quiet(), as_json=False, csv_path=None, plot_path=None, by="gpu-seconds")
    refine, zs = out["budget"]["runs"]
    budgets = np.array(out["budget"]["budgets"])
    # a refine round costs 1 s of generation + 0.5 s of checks: 4.5 s a chain; a zero-shot sample 3 + 1 s
    for b, p in zip(budgets, series(refine, "pass")):
        if b < CHAINS * 4.5 + 4.5:
            assert p == (0.0 if b < 4.5 else 1.0)
    for b, p in zip(budgets, series(zs, "pass")):
        k = int(b // 4.0)
        if 1 <= k <= N_ZS:
            assert p == pytest.approx(pass_at_k(N_ZS, C_ZS, k), abs=1e-12)
    assert out["budget"]["compare"] == []  # only with --compare


def test_by_samples_is_pass_at_k_for_one_round_runs(tmp_path):
    """Duplicates, cancelled samples and early-stopped tasks (fewer samples) as the run report has them."""
    n = 6
    rows = []
    for t, statuses in zip(LEVEL1 + LEVEL2, (["correct", "incorrect", "correct", "no_code", "incorrect", "incorrect"],
                                             ["incorrect"] * 6, ["incorrect", "correct", "cancelled"],
                                             ["timeout", "incorrect", "correct", "correct", "incorrect"])):
        for i, status in enumerate(statuses):
            rows.append(record(t, i, 0, status, n, 1.0 + i if status == "correct" else None, chain_field=False))
    rows[2]["duplicate_of"] = 0
    run = write_run(tmp_path / "zs", "zero-shot", n, 1, rows)
    out = report([run], quiet(), as_json=False, csv_path=None, plot_path=None, by="samples")
    view = out["budget"]["runs"][0]
    rs = RunStats(records_of(rows), json.loads((run / "config.json").read_text()))
    assert out["budget"]["budgets"] == list(range(1, n + 1))
    for k in range(1, n + 1):
        assert view["all"]["pass"]["mean"][k - 1] == pytest.approx(rs.summary["pass_at_k"][str(k)], abs=1e-12)
        assert view["all"]["fast_1.0"]["mean"][k - 1] == pytest.approx(rs.summary["fast_p_at_k"]["1.0"][str(k)], abs=1e-12)
        assert view["all"]["best"]["mean"][k - 1] == pytest.approx(rs.summary["expected_best_speedup"][str(k)], abs=1e-12)
        assert view["all"]["tasks"][k - 1] == rs.summary["tasks_at_k"][str(k)]


# ---------------------------------------------------------------- the estimator on one task


def enumerate_orders(task: TaskChains, budget: float, p: float = 1.0) -> tuple[float, float, float]:
    """pass, fast_p and best at `budget` averaged over every order of the chains, buying while they fit."""
    totals = np.zeros(3)
    orders = list(itertools.permutations(task.chains))
    for order in orders:
        left, bought = budget - task.shared_cost, []
        for chain in order:
            if chain.cost > left + 1e-12:
                break
            left -= chain.cost
            bought.append(chain)
        best = max((c.best_speedup for c in bought), default=0.0)
        totals += [any(c.correct for c in bought), best > p, best]
    return tuple(totals / len(orders))


def test_unequal_costs_match_enumeration_of_every_order():
    chains = [Chain(300, 1, True, 2.5), Chain(1200, 4, False, 0.0), Chain(700, 3, True, 0.8),
              Chain(1200, 4, False, 0.0), Chain(450, 2, True, 1.2)]
    task = TaskChains("level1/1_Op", "level1", chains, shared_cost=100)
    assert task.limit == pytest.approx(100 + 3850 + 300)
    budgets = np.array([50.0, 399.0, 400.0, 900.0, 1500.0, 2600.0, 4249.0, 4250.0])
    reps = 100_000
    curve = task_curve(task, budgets, reps=reps, seed=3)
    assert curve.included.tolist() == [True] * 7 + [False]
    tolerance = 5 * 0.5 / math.sqrt(reps)  # five Monte Carlo standard errors at worst (p = 1/2)
    for j, b in enumerate(budgets[:-1]):
        want = enumerate_orders(task, b)
        got = (curve.values["pass"][j], curve.values["fast_1.0"][j], curve.values["best"][j])
        assert got[0] == pytest.approx(want[0], abs=tolerance)
        assert got[1] == pytest.approx(want[1], abs=tolerance)
        assert got[2] == pytest.approx(want[2], abs=2.5 * tolerance * 2)  # speedups up to 2.5
    # below the shared cost and the cheapest chain nothing is bought; with all bought, the whole task's outcome
    assert curve.values["pass"][0] == 0.0 and curve.values["pass"][1] == 0.0
    assert curve.values["pass"][6] == 1.0 and curve.values["best"][6] == 2.5
    assert np.isnan(curve.values["pass"][7])
    # seeded: the same numbers again
    again = task_curve(task, budgets, reps=reps, seed=3)
    assert all(np.array_equal(curve.values[k], again.values[k], equal_nan=True) for k in curve.values)


def test_equal_costs_are_exact_k_subsets():
    chains = [Chain(250, 1, ok, s) for ok, s in ((True, 1.5), (False, 0.0), (True, 0.7), (False, 0.0), (False, 0.0))]
    task = TaskChains("t", "level1", chains)
    budgets = np.array([100.0, 250.0, 499.0, 500.0, 1000.0, 1250.0, 1499.0, 1500.0])
    curve = task_curve(task, budgets)
    for j, b in enumerate(budgets):
        k = int(b // 250)
        if k > 5:
            assert not curve.included[j]
            continue
        assert curve.values["pass"][j] == pytest.approx(pass_at_k(5, 2, k) if k else 0.0, abs=1e-12)
        speedups = [1.5, 0.0, 0.7, 0.0, 0.0]
        assert curve.values["best"][j] == pytest.approx(expected_best_speedup(speedups, 5, k) if k else 0.0, abs=1e-12)


# ---------------------------------------------------------------- bias against direct subsampling

# A refinement strategy whose rounds learn from the last one: a chain stops at its first correct round;
# round r (0-based) is correct with probability Q[r] if the earlier ones were not. A round costs 200 to
# 600 tokens (uniform integers), a correct round's speedup is uniform on [0.5, 3].
Q = (0.1, 0.25, 0.4, 0.55)
TOKENS = (200, 601)
BUDGETS = np.array([250.0, 500.0, 900.0, 1300.0, 1700.0])  # all below 8 chains x 200 + 200: never left out
M, DATASETS, ORDERS = 8, 400, 400
P = 1.0


def simulate_chains(rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`count` chains: cost, rounds, correct, best speedup."""
    rounds = np.full(count, len(Q))
    correct = np.zeros(count, dtype=bool)
    draws = rng.random((count, len(Q)))
    for r in range(len(Q) - 1, -1, -1):  # the first round that succeeds
        hit = draws[:, r] < Q[r]
        rounds = np.where(hit, r + 1, rounds)
        correct |= hit
    costs = rng.integers(*TOKENS, size=(count, len(Q)))
    cost = np.where(np.arange(len(Q))[None, :] < rounds[:, None], costs, 0).sum(axis=1).astype(np.float64)
    speedup = np.where(correct, rng.uniform(0.5, 3.0, size=count), 0.0)
    return cost, rounds, correct, speedup


def direct_subsampling(budgets: np.ndarray, runs: int, seed: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The truth: fresh runs of the strategy, each drawing new chains until the next does not fit."""
    rng = np.random.default_rng(seed)
    longest = int(budgets.max() // (TOKENS[0])) + 1  # no run buys more chains than this
    cost, _, correct, speedup = (a.reshape(runs, longest) for a in simulate_chains(rng, runs * longest))
    spent = np.cumsum(cost, axis=1)
    out = {}
    for name in ("pass", "fast", "best"):
        means, ses = [], []
        for b in budgets:
            bought = spent <= b
            best = np.where(bought, speedup, 0.0).max(axis=1)
            value = {"pass": (bought & correct).any(axis=1).astype(float), "fast": (best > P).astype(float), "best": best}[name]
            means.append(value.mean())
            ses.append(value.std(ddof=1) / math.sqrt(runs))
        out[name] = (np.array(means), np.array(ses))
    return out


def estimates(budgets: np.ndarray, seed: int, per_round: bool = False) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The estimator on DATASETS recorded runs of M chains each: its mean and the mean's standard error.
    `per_round`: the same records resampled round by round as if every round were a sample of its own
    (what the estimator must not do), to show the check can tell."""
    rng = np.random.default_rng(seed)
    values = {"pass": [], "fast": [], "best": []}
    for d in range(DATASETS):
        cost, rounds, correct, speedup = simulate_chains(rng, M)
        if per_round:
            chains = []
            for c, r, ok, s in zip(cost, rounds, correct, speedup):
                for i in range(r):
                    last = i == r - 1
                    chains.append(Chain(c / r, 1, bool(ok and last), float(s) if ok and last else 0.0))
        else:
            chains = [Chain(float(c), int(r), bool(ok), float(s)) for c, r, ok, s in zip(cost, rounds, correct, speedup)]
        curve = task_curve(TaskChains(f"task{d}", "level1", chains), budgets, ps=(P,), reps=ORDERS, seed=seed)
        assert curve.included.all()
        values["pass"].append(curve.values["pass"])
        values["fast"].append(curve.values[f"fast_{P}"])
        values["best"].append(curve.values["best"])
    return {k: (np.mean(v, axis=0), np.std(v, axis=0, ddof=1) / math.sqrt(DATASETS)) for k, v in values.items()}


def z_scores(est: dict, truth: dict) -> dict[str, np.ndarray]:
    return {k: (est[k][0] - truth[k][0]) / np.hypot(est[k][1], truth[k][1]) for k in est}


@pytest.fixture(scope="module")
def truth() -> dict:
    return direct_subsampling(BUDGETS, runs=200_000, seed=11)


def test_estimator_is_unbiased_against_direct_subsampling(truth):
    est = estimates(BUDGETS, seed=5)
    z = z_scores(est, truth)
    for name in ("pass", "fast", "best"):
        assert np.all(np.abs(z[name]) < 4), (name, z[name], est[name][0], truth[name][0])
        # and small in absolute terms: within 0.02 (pass, fast) or 0.05x (best) of the truth
        assert np.all(np.abs(est[name][0] - truth[name][0]) < (0.05 if name == "best" else 0.02))
    # the truth is not flat: the budgets tell the strategy's curve apart
    assert truth["pass"][0][0] < 0.2 < 0.6 < truth["pass"][0][-1]


def test_resampling_rounds_instead_of_chains_is_biased(truth):
    """The check has teeth: resampling rounds as independent samples, on the same records, is far off."""
    z = z_scores(estimates(BUDGETS, seed=5, per_round=True), truth)
    assert np.max(np.abs(z["pass"])) > 10


# ---------------------------------------------------------------- grid, bootstrap, overtaking


def test_grid_and_table_budgets():
    a = TaskChains("a", "level1", [Chain(1, 1, False, 0.0)] * 3)  # limit 4
    b = TaskChains("b", "level1", [Chain(2, 2, True, 1.0)] * 2)  # limit 6
    assert budget_grid([a, b], "samples").tolist() == [1, 2, 3, 4, 5]
    c = TaskChains("c", "level1", [Chain(300.0, 1, True, 1.0), Chain(500.0, 1, False, 0.0)])  # limit 1100
    grid = budget_grid([c], "tokens")
    assert grid[0] <= 300 < grid[1] and grid[-1] < 1100 <= grid[-1] * 2 ** (1 / 16)
    picks = [grid[i] for i in table_budgets(grid, "tokens")]
    assert picks[:2] == [512.0, 1024.0] and picks[-1] == grid[-1]
    assert budget_grid([], "tokens").size == 0


def curves_for(pass_by_task: dict[str, list[float]], budgets) -> list:
    """TaskCurves whose pass is given per task (included everywhere), built through task_curve's type."""
    out = []
    for task, values in pass_by_task.items():
        curve = task_curve(TaskChains(task, "level1", [Chain(1, 1, False, 0.0)] * 50), budgets)
        curve.values["pass"] = np.array(values, dtype=float)
        out.append(curve)
    return out


def test_overtake_interval_and_no_crossing():
    budgets = np.array([1.0, 2.0, 4.0, 8.0, 16.0])
    # run a starts behind on every task and gets ahead at 4 on most of them, at 8 on one, never on one
    a = curves_for({"t1": [0.1, 0.2, 0.8, 0.9, 1.0], "t2": [0.0, 0.3, 0.7, 0.9, 1.0], "t3": [0.1, 0.2, 0.3, 0.9, 1.0],
                    "t4": [0.0, 0.1, 0.2, 0.3, 0.4], "t5": [0.1, 0.3, 0.8, 1.0, 1.0]}, budgets)
    b = curves_for({t: [0.4, 0.5, 0.5, 0.7, 0.8] for t in ("t1", "t2", "t3", "t4", "t5")}, budgets)
    o = overtake(a, b, ("a", "b"), budgets, "pass", reps=2000, seed=1)
    assert (o.leader, o.other, o.budget, o.tasks, o.max_budget) == ("b", "a", 4.0, 5, 16.0)
    assert o.low <= o.budget <= (o.high or math.inf) and o.low >= 2.0
    assert 0.5 < o.crossing_share <= 1.0
    # the same pair the other way round names the same leader
    assert overtake(b, a, ("b", "a"), budgets, "pass").budget == 4.0
    assert o.lead_changes == 1
    # ahead at 2 on noise, behind again at 4, ahead for good from 8: the overtaking is at 8
    back = overtake(curves_for({"t1": [0.1, 0.6, 0.4, 0.9, 1.0]}, budgets), curves_for({"t1": [0.5] * 5}, budgets),
                    ("a", "b"), budgets)
    assert (back.leader, back.budget, back.lead_changes) == ("b", 8.0, 3)
    # never overtaken within the range
    never = overtake(curves_for({"t1": [0.0] * 5}, budgets), curves_for({"t1": [0.5] * 5}, budgets), ("a", "b"), budgets)
    assert never.leader == "b" and never.budget is None and never.crossing_share == 0.0
    assert never.low is None and never.high is None
    # equal everywhere, and no common task
    tied = overtake(curves_for({"t1": [0.5] * 5}, budgets), curves_for({"t1": [0.5] * 5}, budgets), ("a", "b"), budgets)
    assert tied.leader is None and tied.max_budget == 16.0
    apart = overtake(curves_for({"t1": [0.5] * 5}, budgets), curves_for({"t2": [0.5] * 5}, budgets), ("a", "b"), budgets)
    assert apart.tasks == 0 and apart.max_budget is None


def test_bootstrap_band_holds_the_mean_and_varies_with_tasks():
    budgets = np.array([1.0, 2.0, 4.0])
    curves = curves_for({"t1": [0.0, 0.2, 0.4], "t2": [1.0, 1.0, 1.0], "t3": [0.5, 0.6, 0.9]}, budgets)
    s = summarize_curves(curves, budgets)
    assert s.mean["pass"].tolist() == pytest.approx([0.5, 0.6, 2.3 / 3])
    assert np.all(s.low["pass"] <= s.mean["pass"]) and np.all(s.mean["pass"] <= s.high["pass"])
    assert s.low["pass"][0] < 0.3 and s.high["pass"][0] > 0.7
    again = summarize_curves(curves, budgets)
    assert np.array_equal(s.low["pass"], again.low["pass"])  # seeded


# ---------------------------------------------------------------- the adapter from records


def test_budget_records_from_run_records():
    config = {"plan": {"n": 2, "rounds": 2}, "strategy": "refine", "tasks": [{"id": "builtin/1_X", "level": 1}]}
    shared = {"step": "analysis", "seed": 77, "tokens": 300, "generation_s": 4.0}
    own = {"step": "triage", "seed": 78, "tokens": 40, "generation_s": 0.5}
    rows = [
        # older records: no chain field, so chain = sample when rounds build on each other (refine, 2 rounds)
        record("builtin/1_X", 0, 0, "incorrect", 2, chain_field=False, agent_steps=[shared]),
        record("builtin/1_X", 1, 0, "correct", 2, 1.2, chain_field=False, agent_steps=[shared]),
        record("builtin/1_X", 0, 1, "correct", 2, 0.9, chain_field=False, agent_steps=[own], duplicate_of=1,
               verify_s=None, time_s=None),
        record("builtin/1_X", 1, 1, "cancelled", 2, chain_field=False, tokens=30),
        record("level2/2_Y", 0, 0, "correct", 2, None, chain_field=False),  # correct without a timing
    ]
    out = budget_records(records_of(rows), config)
    assert [(s.task, s.chain, s.round) for s in out.samples] == [("builtin/1_X", 0, 0), ("builtin/1_X", 1, 0),
                                                                ("builtin/1_X", 0, 1), ("level2/2_Y", 0, 0)]
    first, second, third, fourth = out.samples
    assert first.level == "level1" and fourth.level == "level2"
    assert (first.correct, first.speedup_vs_eager, second.speedup_vs_eager, fourth.speedup_vs_eager) == (False, 0.0, 1.2, 0.0)
    assert (first.tokens, first.generation_s, first.oracle_device_s) == (100, 2.0, 0.5)
    assert (third.tokens, third.generation_s, third.oracle_device_s) == (140, 2.5, 0.0)  # its own triage; a duplicate
    assert out.shared == [type(out.shared[0])("builtin/1_X", 300, 4.0)]  # the analysis both chains share: once
    tasks, missing = chains_by_task(out, "tokens")
    x = tasks[0]
    assert (x.task, x.shared_cost, missing) == ("builtin/1_X", 300.0, 0)
    assert [(c.cost, c.rounds, c.correct, c.best_speedup) for c in x.chains] == [(240.0, 2, True, 0.9), (100.0, 1, True, 1.2)]
    tasks, _ = chains_by_task(out, "gpu-seconds")
    assert tasks[0].shared_cost == 4.0 and tasks[0].chains[0].cost == pytest.approx(2.5 + 2.5)
    assert chains_by_task(out, "samples")[0][0].chains[0].cost == 2.0
    # the same records from a zero-shot run of 2 rounds: every sample its own chain (its sample number)
    zs = budget_records(records_of(rows), {**config, "strategy": "zero-shot"})
    assert [s.chain for s in zs.samples] == [0, 1, 2, 0]
    # a recorded chain field wins over both
    assert [s.chain for s in budget_records(records_of([{**rows[0], "chain": 5}]), config).samples] == [5]
    # the oracle's seconds are counted where it gave them; a failed check that came back without them is counted
    assert out.unclocked == 0
    failed = record("builtin/1_X", 0, 0, "incorrect", 2, verify_s=None)
    assert budget_records(records_of([failed, {**failed, "status": "compile_error"}]), config).unclocked == 1


def test_runs_without_generation_seconds_are_left_out_of_gpu_seconds(tmp_path, zero_shot_run):
    rows = [{k: v for k, v in record(t, i, 0, "incorrect", 4).items() if k != "generation_s"}
            for t in LEVEL1 for i in range(4)]
    old = write_run(tmp_path / "old", "zero-shot", 4, 1, rows)
    out = report([old, zero_shot_run], quiet(), as_json=False, csv_path=None, plot_path=None, by="gpu-seconds")
    assert [r["label"] for r in out["budget"]["runs"]] == ["zero-shot"]
    assert any("old: no generation seconds" in note for note in out["budget"]["notes"])
    out = report([old], quiet(), as_json=False, csv_path=None, plot_path=None, by="tokens")
    assert out["budget"]["runs"][0]["chains"] == 12


def test_plot_and_cli(tmp_path, refine_run, zero_shot_run):
    png = tmp_path / "budget.png"
    res = subprocess.run([sys.executable, "-m", "search.cli", "report", str(refine_run), str(zero_shot_run), "--by", "tokens",
                          "--compare", "--plot", str(png)], capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={**__import__("os").environ, "COLUMNS": "160"})
    assert res.returncode == 0, res.stderr[-2000:]
    assert "pass at budget [95% CI] · by tokens" in res.stdout and "overtaking · by tokens" in res.stdout
    assert "by level" in res.stdout and "refine · level2" in res.stdout
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and 10_000 < len(data) < 400_000
    bad = subprocess.run([sys.executable, "-m", "search.cli", "report", str(refine_run), "--by", "watts"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert bad.returncode == 2 and "--by must be one of samples, tokens, gpu-seconds" in bad.stderr
    assert "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------- what the engine records for it


def test_timed_sets_generation_seconds_it_lacks():
    async def stream():
        yield Completion("r", 0, 1, "a")
        yield Completion("r", 1, 2, "b", generation_s=7.5)  # set by the generator itself (replay): kept
        yield Completion("r", -1, 0, "", error="failed")  # the request failed: not a sample

    async def collect():
        return [c async for c in timed(stream())]

    first, second, failed = asyncio.run(collect())
    assert first.generation_s is not None and first.generation_s >= 0.0
    assert second.generation_s == 7.5 and failed.generation_s is None


def test_replay_passes_recorded_costs_on(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"task": "t", "completion": "x", "tokens": 321, "prompt_tokens": 45, "generation_s": 6.5}) + "\n"
                    + json.dumps({"task": "u", "completion": "y", "tokens": "many"}) + "\n")
    gen = ReplayGenerator(path, delay_s=0.0)

    async def one(task):
        return [c async for c in gen.sample(SampleRequest("r", task, [], [1]))][0]

    t, u = asyncio.run(one("t")), asyncio.run(one("u"))
    assert (t.tokens, t.prompt_tokens, t.generation_s) == (321, 45, 6.5)
    assert (u.tokens, u.prompt_tokens, u.generation_s) == (0, 0, 0.0)  # nothing usable recorded: the replay's own delay


class TimedStub:
    """Looks like a GeneratorClient; every completion says it took 1.5 s and 10 tokens."""

    def __init__(self, text: str):
        self.text = text

    async def sample(self, request: SampleRequest):
        for i, s in enumerate(request.seeds):
            await asyncio.sleep(0)
            yield Completion(request.request_id, i, s, self.text, tokens=10, generation_s=1.5)

    async def abort(self, request_id: str) -> None:
        pass


class NoOracle:
    capacity = 2

    async def evaluate(self, task, candidate, retime=False):
        raise AssertionError("no candidate has code")

    async def profile(self, task):
        return {"ops": []}


@pytest.mark.parametrize("strategy, chained", [("zero-shot", False), ("refine", True), ("agents", True)])
def test_controller_records_chain_and_generation_seconds(tmp_path, strategy, chained):
    from search.controller import Controller, SearchPlan
    from search.store import RunStore
    from strategies import make_strategy
    from tasks import Selection, load_tasks

    task = load_tasks("builtin", Selection(task_ids=frozenset({"builtin/1_LeakyReLU_Scale"})), 64).tasks[0]
    store = RunStore.create(tmp_path / "run", {"strategy": strategy, "strategy_options": {"backend": "cpp"}})
    plan = SearchPlan(n=2, rounds=2, seed=0, early_stop=False, max_tokens=64)
    controller = Controller(plan, make_strategy(strategy, "cpp"), TimedStub("no code here"), NoOracle(), store)
    asyncio.run(asyncio.wait_for(controller.run([task]), 60))
    rows = store.samples()
    assert len(rows) == 4 and all(r.generation_s == 1.5 and r.tokens_out == 10 for r in rows)
    for r in rows:
        assert r.chain == (r.sample_index % plan.n if chained else r.sample_index)
    if strategy == "agents":
        helpers = [s for r in rows for s in r.agent_steps if "messages" in s]
        assert helpers and all(s["generation_s"] == 1.5 for s in helpers)
    out = budget_records(rows, store.config())
    assert len({s.chain for s in out.samples}) == (2 if chained else 4)
