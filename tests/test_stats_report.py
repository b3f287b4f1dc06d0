"""search.stats estimators against brute force over every k-subset, and `report` on run folders written here."""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import random
from pathlib import Path

import pytest
from rich.console import Console

from oracle.verdict import Verdict
from search.report import CSV_COLUMNS, ReportError, report
from search.store import SampleRecord
from search.stats import (RunStats, bootstrap_ci, curve, expected_best_speedup, expected_best_speedup_all_k,
                          fast_p_at_k, pass_at_all_k, pass_at_k, powers_of_two)


# ---------------------------------------------------------------- estimators vs brute force


def brute_pass(n: int, c: int, k: int) -> float:
    """Fraction of the k-subsets of n samples (the first c correct) holding a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


def brute_best(speedups: list[float], k: int) -> float:
    subsets = list(itertools.combinations(speedups, k))
    return sum(max(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 8))
def test_pass_at_k_matches_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_pass(n, c, k), abs=1e-12)
            assert fast_p_at_k(n, c, k) == pytest.approx(brute_pass(n, c, k), abs=1e-12)


def test_pass_at_k_edges_and_large_n():
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 5, 1) == 1.0
    assert pass_at_k(5, 1, 1) == pytest.approx(0.2)
    # n in the thousands: the binomials overflow floats, the product form does not
    exact = 1 - math.comb(2000 - 7, 300) / math.comb(2000, 300)
    assert pass_at_k(2000, 7, 300) == pytest.approx(exact, rel=1e-12)
    for bad in [(4, 1, 5), (4, 1, 0), (4, 5, 1), (4, -1, 1)]:
        with pytest.raises(ValueError):
            pass_at_k(*bad)


@pytest.mark.parametrize("n", range(1, 8))
def test_expected_best_speedup_matches_enumeration(n):
    rng = random.Random(n)
    for trial in range(5):
        # incorrect samples are 0, ties and repeated values (duplicates) included
        speedups = [rng.choice([0.0, 0.0, 0.5, 1.0, 1.5, rng.uniform(0, 4)]) for _ in range(n)]
        for k in range(1, n + 1):
            assert expected_best_speedup(speedups, n, k) == pytest.approx(brute_best(speedups, k), abs=1e-12)
    assert expected_best_speedup([3.0, 1.0, 2.0], 3, 1) == pytest.approx(2.0)  # the mean
    assert expected_best_speedup([3.0, 1.0, 2.0], 3, 3) == pytest.approx(3.0)  # the max
    with pytest.raises(ValueError):
        expected_best_speedup([1.0, 2.0], 3, 1)


def test_expected_best_speedup_large_n_is_stable():
    s = list(range(1000))
    # E[max of k from 0..n-1] = k (n) / (k + 1) - 1 for a uniform permutation of 0..n-1
    assert expected_best_speedup(s, 1000, 500) == pytest.approx(500 * 1001 / 501 - 1, rel=1e-12)


@pytest.mark.parametrize("n", range(1, 8))
def test_all_k_forms_match_enumeration(n):
    rng = random.Random(100 + n)
    for c in range(n + 1):
        assert pass_at_all_k(n, c) == pytest.approx([brute_pass(n, c, k) for k in range(1, n + 1)], abs=1e-12)
    speedups = [rng.choice([0.0, 0.7, 1.5, rng.uniform(0, 4)]) for _ in range(n)]
    assert expected_best_speedup_all_k(speedups) == pytest.approx([brute_best(speedups, k) for k in range(1, n + 1)], abs=1e-12)


def test_all_k_forms_match_scalars_at_large_n():
    rng = random.Random(7)
    for n in (60, 2100):  # 2100 takes the row-by-row path
        speedups = [rng.uniform(0, 3) if rng.random() < 0.3 else 0.0 for _ in range(n)]
        ks = [1, 2, 3, n // 2, n - 1, n]
        fast = expected_best_speedup_all_k(speedups)
        assert [fast[k - 1] for k in ks] == pytest.approx([expected_best_speedup(speedups, n, k) for k in ks], rel=1e-10)
        passes = pass_at_all_k(n, 5)
        assert [passes[k - 1] for k in ks] == pytest.approx([pass_at_k(n, 5, k) for k in ks], rel=1e-12)


def test_curve_fast_path_matches_scalar_path():
    items = [(7, 2), (3, 0), (5, 5), (1, 1), (0, 0)]
    slow = curve(items, range(1, 8), lambda n, c, k: pass_at_k(n, c, k))  # not in the table of all-k forms
    fast = curve(items, range(1, 8))
    for k in range(1, 8):
        assert (fast[k]["tasks"], fast[k]["left_out"]) == (slow[k]["tasks"], slow[k]["left_out"])
        assert fast[k]["mean"] == pytest.approx(slow[k]["mean"], abs=1e-12)
    assert slow[1]["left_out"] == 1 and slow[6]["tasks"] == 1


def test_curve_leaves_out_tasks_with_fewer_samples():
    points = curve([(4, 1), (4, 0), (2, 2)], [1, 2, 3, 4])
    assert points[1] == {"mean": pytest.approx((0.25 + 0 + 1) / 3), "tasks": 3, "left_out": 0}
    assert points[3]["tasks"] == 2 and points[3]["left_out"] == 1
    assert points[3]["mean"] == pytest.approx((brute_pass(4, 1, 3) + 0) / 2)
    assert curve([(1, 0)], [2])[2] == {"mean": None, "tasks": 0, "left_out": 1}
    best = curve([(2, [0.0, 2.0])], [1, 2], lambda n, s, k: expected_best_speedup(s, n, k))
    assert best[1]["mean"] == pytest.approx(1.0) and best[2]["mean"] == pytest.approx(2.0)


def test_bootstrap_ci_contains_mean_and_narrows():
    rng = random.Random(0)
    values = [rng.random() for _ in range(10)]
    low, high = bootstrap_ci(values)
    mean = sum(values) / len(values)
    assert low <= mean <= high and low < high
    assert bootstrap_ci(values) == (low, high)  # seeded: a report is reproducible
    many = [rng.random() for _ in range(1000)]
    low2, high2 = bootstrap_ci(many)
    assert low2 <= sum(many) / len(many) <= high2
    assert high2 - low2 < (high - low) / 3
    assert bootstrap_ci([0.5]) == (0.5, 0.5)
    wide = bootstrap_ci(values, alpha=0.01)
    assert wide[0] <= low and wide[1] >= high
    with pytest.raises(ValueError):
        bootstrap_ci([])


def test_powers_of_two():
    assert powers_of_two(1) == [1]
    assert powers_of_two(8) == [1, 2, 4, 8]
    assert powers_of_two(6) == [1, 2, 4, 6]
    assert powers_of_two(0) == []


# ---------------------------------------------------------------- fixture run folders

T0 = 1_700_000_000.0
TASKS = [{"id": "level1/1_A", "level": 1}, {"id": "level1/2_B", "level": 1}, {"id": "level2/3_C", "level": 2}]


def sample(task, strategy, number, status, n, eager=None, compile=None, dup=None, tokens=100, time_s=2.0,
           build_s=10.0, at=0.0) -> SampleRecord:
    verdict = None
    if status != "cancelled":
        verdict = Verdict(task, status, "", hash=None if status == "no_code" else f"h-{task}-{dup if dup is not None else number}",
                          time_ms=1.0 if status == "correct" else None, eager_ms=1.5, compile_ms=1.2,
                          speedup_vs_eager=eager, speedup_vs_compile=compile, build_s=build_s, verify_s=1.0, time_s=time_s)
    device_s = 0.0 if verdict is None or dup is not None else verdict.candidate_device_s
    return SampleRecord(task, strategy, round=number // n, chain=number % n, sample_index=number, seed=1000 + number,
                        status=status, verdict=verdict, duplicate_of=dup, tokens_in=50, tokens_out=tokens,
                        oracle_device_s=device_s, recorded_at=T0 + at)


def write_run(root: Path, strategy: str, n: int, records: list[dict], best: dict | None = None) -> Path:
    root.mkdir(parents=True)
    config = {"plan": {"n": n, "rounds": 1, "target_speedup": 2.0, "early_stop": True, "seed": 0},
              "strategy": strategy, "generator": "replay:x.jsonl", "device": "cuda", "compile_baseline": True,
              "tasks": TASKS, "started_at": T0 - 5}
    (root / "config.json").write_text(json.dumps(config))
    lines = (r.to_json() if isinstance(r, SampleRecord) else r for r in records)
    (root / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (root / "best").mkdir()
    for slug, verdict in (best or {}).items():
        (root / "best" / f"{slug}.json").write_text(json.dumps(verdict))
    return root


@pytest.fixture
def run_a(tmp_path) -> Path:
    """n=4. A: 2 of 4 correct (one a duplicate), 1.5x eager, 0.9x compile. B: nothing correct.
    C: stopped early after 2 judged samples (1 correct at 2.5x), a third cancelled; re-timed best 2.4x.
    A's best/ is its own verdict (`"retimed": false`)."""
    s = "best_of_n"
    records = [
        sample("level1/1_A", s, 0, "correct", 4, 1.5, 0.9, at=1),
        sample("level1/1_A", s, 1, "incorrect", 4, at=2),
        sample("level1/1_A", s, 2, "correct", 4, 1.5, 0.9, dup=0, at=3),
        sample("level1/1_A", s, 3, "compile_error", 4, time_s=0.0, at=4),
        sample("level1/2_B", s, 0, "runtime_error", 4, at=5),
        sample("level1/2_B", s, 1, "timeout", 4, time_s=30.0, at=6),
        sample("level1/2_B", s, 2, "no_code", 4, time_s=None, build_s=None, at=7),
        sample("level1/2_B", s, 3, "incorrect", 4, at=8),
        sample("level2/3_C", s, 0, "incorrect", 4, at=9),
        sample("level2/3_C", s, 1, "correct", 4, 2.5, 1.2, at=10),
        sample("level2/3_C", s, 2, "cancelled", 4, time_s=None, build_s=None, tokens=40, at=11),
    ]
    # A's only correct kernel kept its own verdict (not re-timed); C's best was re-timed
    best = {"level1__1_A": {"status": "correct", "speedup_vs_eager": 1.5, "speedup_vs_compile": 0.9, "retimed": False},
            "level2__3_C": {"status": "correct", "speedup_vs_eager": 2.4, "speedup_vs_compile": 1.1, "retimed": True}}
    return write_run(tmp_path / "run_a", s, 4, records, best)


@pytest.fixture
def run_b(tmp_path) -> Path:
    """n=2, another strategy: A 1 of 2 correct at 3x, B 0 of 2, C 2 of 2 at 0.8x and 1.2x."""
    s = "refine"
    records = [
        sample("level1/1_A", s, 0, "incorrect", 2, at=1),
        sample("level1/1_A", s, 1, "correct", 2, 3.0, 2.0, at=2),
        sample("level1/2_B", s, 0, "incorrect", 2, at=3),
        sample("level1/2_B", s, 1, "compile_error", 2, at=4),
        sample("level2/3_C", s, 0, "correct", 2, 0.8, 0.5, at=5),
        sample("level2/3_C", s, 1, "correct", 2, 1.2, 0.9, at=6),
    ]
    return write_run(tmp_path / "run_b", s, 2, records)


def quiet() -> Console:
    return Console(file=io.StringIO(), width=160)


def test_report_numbers_by_hand(run_a, tmp_path):
    console = quiet()
    out = report([run_a], console, as_json=True, csv_path=None, plot_path=None)
    assert json.loads(console.file.getvalue()) == json.loads(json.dumps(out))  # the JSON object and nothing else

    (run,) = out["runs"]
    assert run["label"] == "run_a" and run["strategy"] == "best_of_n"
    assert run["n"] == 4 and run["n_planned"] == 4
    assert (run["tasks_total"], run["samples"], run["correct"], run["cancelled"], run["duplicates"]) == (3, 10, 3, 1, 1)
    # per task (n, c): A (4, 2), B (4, 0), C (2, 1): C is left out at k = 3, 4
    p = run["pass_at_k"]
    assert p["1"] == pytest.approx((2 / 4 + 0 + 1 / 2) / 3)
    assert p["2"] == pytest.approx((1 - 1 / 6 + 0 + 1) / 3)
    assert p["3"] == pytest.approx((1 + 0) / 2)
    assert p["4"] == pytest.approx(0.5)
    assert run["tasks_at_k"] == {"1": 3, "2": 3, "3": 2, "4": 2}
    # fast_p counts speedup > p strictly: A's 1.5x is not fast_1.5
    f = run["fast_p_at_k"]
    assert set(f) == {"0.0", "1.0", "1.5", "2.0"}
    assert f["0.0"] == pytest.approx(p)
    assert f["1.0"]["1"] == pytest.approx((2 / 4 + 0 + 1 / 2) / 3)
    assert f["1.5"]["1"] == pytest.approx((0 + 0 + 1 / 2) / 3)
    assert f["2.0"]["2"] == pytest.approx((0 + 0 + 1) / 3)
    assert f["1.5"]["4"] == pytest.approx(0.0)
    fc = run["fast_p_at_k_vs_compile"]
    assert fc["1.0"]["1"] == pytest.approx((0 + 0 + 1 / 2) / 3)
    assert fc["0.0"]["4"] == pytest.approx(0.5)
    # expected best speedup: A {1.5, 0, 1.5, 0}, B all 0, C {0, 2.5}
    e = run["expected_best_speedup"]
    assert e["1"] == pytest.approx((0.75 + 0 + 1.25) / 3)
    assert e["2"] == pytest.approx((1.5 * 5 / 6 + 0 + 2.5) / 3)
    assert e["4"] == pytest.approx(0.75)
    assert run["expected_best_speedup_vs_compile"]["2"] == pytest.approx((0.9 * 5 / 6 + 0 + 1.2) / 3)
    # intervals at k = 1, 2, 4 around the point estimate
    assert set(run["pass_at_k_ci"]) == {"1", "2", "4"}
    for k, (low, high) in run["pass_at_k_ci"].items():
        assert low <= p[k] <= high

    a, b, c = (run["tasks"][t] for t in ("level1/1_A", "level1/2_B", "level2/3_C"))
    assert (a["samples"], a["correct"], a["duplicates"], a["first_correct_sample_from_1"]) == (4, 2, 1, 1)
    assert a["status_counts"] == {"correct": 2, "incorrect": 1, "compile_error": 1}
    assert (a["best_speedup_vs_eager"], a["best_speedup_vs_compile"], a["best_retimed"]) == (1.5, 0.9, False)
    assert (b["correct"], b["first_correct_sample_from_1"], b["best_speedup_vs_eager"]) == (0, None, None)
    assert (c["samples"], c["cancelled"], c["first_correct_sample_from_1"]) == (2, 1, 2)
    assert (c["best_speedup_vs_eager"], c["best_speedup_vs_compile"], c["best_retimed"]) == (2.4, 1.1, True)
    assert c["best_sample_speedup_vs_eager"] == 2.5
    assert c["fast"] == {"0.0": 1, "1.0": 1, "1.5": 1, "2.0": 1}

    cost = run["cost"]
    assert cost["tokens"] == 10 * 100 + 40 and cost["prompt_tokens"] == 11 * 50
    # device seconds (checks 1 s, then timing): A 3 + 3 + (dup) 0 + 1, B 3 + 31 + (no code) 1 + 3, C 3 + 3 + (cancelled) 0
    assert cost["device_s"] == pytest.approx(3 + 3 + 0 + 1 + 3 + 31 + 1 + 3 + 3 + 3 + 0)
    assert cost["build_cpu_s"] == pytest.approx(10 * 8)  # 11 records less the duplicate, no_code, cancelled
    assert cost["wall_s"] == pytest.approx(11 + 5)  # from the config's started_at
    assert (cost["correct"], cost["correct_unique"]) == (3, 2)
    assert cost["correct_per_1k_tokens"] == pytest.approx(3 / 1040 * 1000)
    assert cost["correct_per_device_minute"] == pytest.approx(3 / (51 / 60))

    assert set(run["by_level"]) == {"level1", "level2"}
    assert run["by_level"]["level1"]["pass_at_k"]["1"] == pytest.approx((0.5 + 0) / 2)
    assert run["by_level"]["level2"]["n"] == 2 and run["by_level"]["level2"]["pass_at_k"]["2"] == pytest.approx(1.0)
    assert set(run["by_strategy"]) == {"best_of_n"}
    assert run["by_strategy"]["best_of_n"]["pass_at_k"] == p
    assert run["tasks_unsampled"] == []
    assert any("from k=3 on" in note for note in run["notes"])


def test_two_runs_side_by_side_csv_and_plot(run_a, run_b, tmp_path):
    console = quiet()
    csv_path, plot_path = tmp_path / "out" / "tasks.csv", tmp_path / "out" / "passk.png"
    out = report([run_a, run_b], console, as_json=False, csv_path=csv_path, plot_path=plot_path)
    text = console.file.getvalue()
    assert "pass@k" in text and "run_a" in text and "run_b" in text
    assert not text.rstrip().endswith("}")  # no JSON unless asked

    ra, rb = out["runs"]
    assert (ra["label"], rb["label"]) == ("run_a", "run_b")
    assert rb["n"] == 2 and set(rb["pass_at_k"]) == {"1", "2"}
    assert rb["pass_at_k"]["1"] == pytest.approx((0.5 + 0 + 1) / 3)
    assert rb["pass_at_k"]["2"] == pytest.approx((1 + 0 + 1) / 3)
    assert rb["fast_p_at_k"]["1.0"]["1"] == pytest.approx((0.5 + 0 + 0.5) / 3)
    assert rb["expected_best_speedup"]["2"] == pytest.approx((3.0 + 0 + 1.2) / 3)
    assert rb["tasks"]["level1/1_A"]["best_speedup_vs_eager"] == 3.0

    rows = list(csv.reader(csv_path.open()))
    assert rows[0] == CSV_COLUMNS
    assert len(rows) == 1 + 3 + 3
    body = [dict(zip(rows[0], r)) for r in rows[1:]]
    a = next(r for r in body if r["run"] == "run_a" and r["task"] == "level1/1_A")
    assert (a["strategy"], a["level"], a["samples"], a["correct"], a["incorrect"], a["compile_error"]) == \
        ("best_of_n", "level1", "4", "2", "1", "1")
    assert (a["duplicates"], a["first_correct_sample_from_1"], a["best_speedup_vs_eager"]) == ("1", "1", "1.5")
    c = next(r for r in body if r["run"] == "run_a" and r["task"] == "level2/3_C")
    assert (c["cancelled"], c["best_speedup_vs_eager"], c["best_retimed"]) == ("1", "2.4", "True")
    b = next(r for r in body if r["run"] == "run_b" and r["task"] == "level1/2_B")
    assert b["first_correct_sample_from_1"] == "" and b["best_speedup_vs_eager"] == ""

    data = plot_path.read_bytes()
    assert len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"


def test_run_with_no_samples_and_a_torn_last_line(tmp_path):
    empty = write_run(tmp_path / "[bold]empty", "best_of_n", 4, [])
    console = quiet()
    out = report([empty], console, as_json=False, csv_path=None, plot_path=tmp_path / "empty.png")
    assert out["runs"][0]["n"] == 0 and out["runs"][0]["pass_at_k"] == {} and out["runs"][0]["samples"] == 0
    assert len(out["runs"][0]["tasks_unsampled"]) == 3
    assert "tasks of [bold]empty" in console.file.getvalue()  # names are text, not rich markup
    assert (tmp_path / "empty.png").stat().st_size > 0

    live = write_run(tmp_path / "live", "best_of_n", 2, [sample("level1/1_A", "best_of_n", 0, "correct", 2, 1.1, 1.0)])
    with open(live / "samples.jsonl", "a") as f:
        f.write('{"task": "level1/1_A", "sta')  # the sample being written right now
    before = (live / "samples.jsonl").read_bytes()
    out = report([live], quiet(), as_json=False, csv_path=None, plot_path=None)
    assert out["runs"][0]["samples"] == 1
    assert (live / "samples.jsonl").read_bytes() == before  # a report never writes to the run


def test_malformed_run_folders(tmp_path, run_a):
    def error(path: Path) -> str:
        with pytest.raises(ReportError) as exc:
            report([run_a, path], quiet(), as_json=True, csv_path=None, plot_path=None)
        message = str(exc.value)
        assert "\n" not in message and "Traceback" not in message
        return message

    assert "no such run folder" in error(tmp_path / "nope")
    (tmp_path / "bare").mkdir()
    assert "no config.json" in error(tmp_path / "bare")

    bad = write_run(tmp_path / "bad_config", "x", 2, [])
    (bad / "config.json").write_text("{not json")
    assert "not valid JSON" in error(bad)

    bad = write_run(tmp_path / "bad_tasks", "x", 2, [])
    (bad / "config.json").write_text(json.dumps({"plan": {"n": 2}, "tasks": [{"level": 1}]}))
    assert "tasks" in error(bad)

    bad = write_run(tmp_path / "bad_line", "x", 2, [sample("level1/1_A", "x", 0, "correct", 2, 1.0, 1.0)])
    with open(bad / "samples.jsonl", "a") as f:
        f.write("garbage\n" + json.dumps(sample("level1/1_A", "x", 1, "correct", 2, 1.0, 1.0).to_json()) + "\n")
    assert "line 2 is not valid JSON" in error(bad)

    bad = write_run(tmp_path / "no_status", "x", 2, [{"task": "level1/1_A", "sample_number": 0}])
    assert "line 1 is not a sample record" in error(bad)

    bad = write_run(tmp_path / "no_samples", "x", 2, [])
    (bad / "samples.jsonl").unlink()
    assert "no samples.jsonl" in error(bad)

    bad = write_run(tmp_path / "bad_best", "x", 2, [sample("level1/1_A", "x", 0, "correct", 2, 1.0, 1.0)])
    (bad / "best" / "level1__1_A.json").write_text("{")
    assert "best verdict" in error(bad)

    with pytest.raises(ReportError):
        report([], quiet(), as_json=False, csv_path=None, plot_path=None)


def test_runstats_without_compile_baseline_and_mixed_strategies():
    records = [sample("level3/9_X", "a", 0, "correct", 2, 1.3, None), sample("level3/9_X", "b", 1, "incorrect", 2)]
    for r in records:
        r.verdict.compile_ms = None
    rs = RunStats(records, {"plan": {"n": 2}})
    out = rs.to_json()
    assert out["fast_p_at_k_vs_compile"] is None and out["expected_best_speedup_vs_compile"] is None
    assert out["tasks"]["level3/9_X"]["level"] == "level3"
    assert set(out["by_strategy"]) == {"a", "b"}
    assert out["by_strategy"]["a"]["pass_at_k"] == {"1": 1.0}
    assert out["by_strategy"]["b"]["pass_at_k"] == {"1": 0.0}
    assert out["pass_at_k"]["1"] == pytest.approx(0.5)


def test_left_out_caption_only_when_a_task_is_left_out(run_a, run_b):
    console = quiet()
    report([run_b], console, as_json=False, csv_path=None, plot_path=None)  # every task has all n samples
    assert "fewer than" not in console.file.getvalue()
    console = quiet()
    report([run_a], console, as_json=False, csv_path=None, plot_path=None)  # C stopped early at 2 of 4
    text = " ".join(console.file.getvalue().split())  # a caption wraps at its table's width
    assert "* some tasks have fewer than k samples and are left out at this k" in text


def test_unsupported_samples_are_neither_success_nor_failure(tmp_path):
    # A Triton kernel where Triton is missing could not be judged: it is left out of n, like a cancelled one.
    records = [sample("level1/1_A", "s", 0, "correct", 3, 1.2, None), sample("level1/1_A", "s", 1, "unsupported", 3),
               sample("level1/1_A", "s", 2, "incorrect", 3)]
    run = write_run(tmp_path / "run", "s", 3, records)
    console = quiet()
    out = report([run], console, as_json=False, csv_path=tmp_path / "t.csv", plot_path=None)["runs"][0]
    assert (out["n"], out["samples"], out["unsupported"]) == (2, 2, 1)
    assert out["pass_at_k"]["1"] == pytest.approx(0.5) and out["tasks"]["level1/1_A"]["unsupported"] == 1
    assert any("could not be judged here" in note for note in out["notes"])
    assert "1 unsupported" in console.file.getvalue()
    row = next(csv.DictReader((tmp_path / "t.csv").open()))
    assert (row["samples"], row["unsupported"]) == ("2", "1")


def kernelsearch(*args: str) -> "subprocess.CompletedProcess":
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "search.cli", *args], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parent.parent)


FIXTURE_V1 = Path(__file__).resolve().parent / "fixtures" / "run_v1"


def test_report_json_is_json_alone_and_a_run_from_before_sample_records_reads_back(tmp_path):
    # tests/fixtures/run_v1 was written by the flat record format (one task, 4 samples: no code, wrong,
    # correct, and a duplicate of the correct one; a re-timed best).
    res = kernelsearch("report", str(FIXTURE_V1), "--json", "--csv", str(tmp_path / "t.csv"))
    assert res.returncode == 0, res.stderr
    run = json.loads(res.stdout)["runs"][0]  # stdout is the JSON object alone
    assert "written to" in res.stderr
    assert (run["n"], run["samples"], run["correct"], run["duplicates"]) == (4, 4, 2, 1)
    task = run["tasks"]["builtin/1_LeakyReLU_Scale"]
    assert task["status_counts"] == {"correct": 2, "incorrect": 1, "no_code": 1}
    assert task["first_correct_sample_from_1"] == 1 and task["best_retimed"] and task["best_speedup_vs_eager"] > 0
    assert run["cost"]["tokens"] == 400 and run["cost"]["device_s"] > 0
    tables = kernelsearch("report", str(FIXTURE_V1))
    assert tables.returncode == 0 and "2 ok, 1 wrong, 1 no code" in tables.stdout
    budget = kernelsearch("report", str(FIXTURE_V1), "--json", "--by", "samples")  # the budget view too
    assert budget.returncode == 0 and json.loads(budget.stdout)["budget"]["by"] == "samples"


def test_ids_and_headers_are_not_cut_when_the_output_is_not_a_terminal(tmp_path):
    long_id = "level2/2_ConvTranspose2d_BiasAdd_Clamp_Scaling_Clamp_Divide"
    run = write_run(tmp_path / "run", "s", 2, [sample(long_id, "s", 0, "correct", 2, 1.5, 1.1),
                                               sample(long_id, "s", 1, "compile_error", 2)])
    res = kernelsearch("report", str(run))
    assert res.returncode == 0, res.stderr
    assert long_id in res.stdout and "first correct" in res.stdout and "pass@n [95% CI]" in res.stdout
    assert "…" not in res.stdout


def test_report_recounts_under_another_tolerance_policy(tmp_path):
    """`report --tolerance`: correct is what each verdict's `passes` says; one correct only under the asked
    policy was never timed, so it is correct but not fast. A run recorded before policies refuses."""
    records = [sample("level1/1_A", "s", 0, "correct", 3, 2.0), sample("level1/1_A", "s", 1, "incorrect", 3),
               sample("level1/1_A", "s", 2, "incorrect", 3)]
    records[0].verdict.passes = ["kernelbench", "kernelbench-v0.1", "numeric"]
    records[1].verdict.passes = ["kernelbench-v0.1"]  # wrong under kernelbench, right under v0.1: not timed
    root = write_run(tmp_path / "run", "s", 3, records)
    config = json.loads((root / "config.json").read_text())
    (root / "config.json").write_text(json.dumps({**config, "tolerance": "kernelbench"}))

    def report(*args: str) -> dict:
        res = kernelsearch("report", str(root), "--json", *args)
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)["runs"][0]

    own, loose, strict = report(), report("--tolerance", "kernelbench-v0.1"), report("--tolerance", "numeric")
    assert (own["correct"], loose["correct"], strict["correct"]) == (1, 2, 1)
    assert loose["tolerance"] == "kernelbench-v0.1" and loose["run_tolerance"] == "kernelbench"
    assert loose["pass_at_k"]["2"] == pytest.approx(1.0) and own["pass_at_k"]["2"] == pytest.approx(2 / 3)
    assert loose["fast_p_at_k"]["1.0"] == own["fast_p_at_k"]["1.0"]  # the untimed one is not fast
    assert any("never timed" in note for note in loose["notes"])
    budget = kernelsearch("report", str(root), "--json", "--by", "samples", "--tolerance", "kernelbench-v0.1")
    assert budget.returncode == 0, budget.stderr
    refused = kernelsearch("report", str(FIXTURE_V1), "--tolerance", "numeric")
    assert refused.returncode != 0 and "recorded before" in refused.stderr and "Traceback" not in refused.stderr
    assert kernelsearch("report", str(FIXTURE_V1), "--tolerance", "kernelbench").returncode == 0
