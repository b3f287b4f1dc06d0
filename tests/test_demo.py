"""`kernelsearch demo` end to end on the CPU from a cold build cache (the bundled C++ completions through
Ray, the oracle and the live report), then `kernelsearch report` on its run folder with --json and --plot."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from search.demo import DATA, DEMO_TASKS, REAL_MODEL_COMMAND, VARIANTS, demo_completions, expected_outcomes
from search.store import read_samples

ROOT = Path(__file__).resolve().parent.parent


def test_bundled_completions_cover_every_variant_in_both_backends():
    rows = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    for task in DEMO_TASKS:
        for backend in ("cpp", "cuda"):
            assert sorted(r["variant"] for r in rows if r["task"] == task and r["backend"] == backend) == sorted(VARIANTS)
    for r in rows:  # written as a model answers: a sentence, then one python block defining ModelNew
        prose, _, rest = r["completion"].partition("```python\n")
        assert prose.strip() and "class ModelNew" in rest and rest.rstrip().endswith("```")
    # a CPU runs the C++ ones, a GPU the CUDA ones
    assert {r["backend"] for r in demo_completions("cpu")} == {"cpp"}
    assert {r["backend"] for r in demo_completions("cuda")} == {"cuda"}
    assert len(demo_completions("cpu")) == len(DEMO_TASKS) * len(VARIANTS)


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("demo")
    env = dict(os.environ, KERNELSEARCH_CACHE=str(tmp / "cache"), PYTHONUNBUFFERED="1")
    out = tmp / "run"
    res = subprocess.run([sys.executable, "-m", "search.demo", "--out", str(out), "--device", "cpu"],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return out, res.stdout, env


@pytest.mark.slow
def test_demo_judges_every_variant_as_expected(demo_run):
    out, stdout, _ = demo_run
    # what the user reads: no model, the live report's plain lines, the tables, the real-model command
    assert "no model is used" in stdout and "No model was used" in stdout and REAL_MODEL_COMMAND in stdout
    assert not re.search(r"\x1b|\r", stdout), "piped output must carry no control codes"
    assert len(re.findall(r"^\[\d+/18\] ", stdout, re.M)) == 18
    assert re.search(r"^pass@k over 3 tasks: k=1 0\.333 k=2 .* k=4 .* k=6 1\.000", stdout, re.M)
    assert "kernelsearch report" in stdout

    records = read_samples(out / "samples.jsonl")
    assert len(records) == 18 and Counter(r.task for r in records) == {t: 6 for t in DEMO_TASKS}
    outcomes = expected_outcomes(out)
    for task in DEMO_TASKS:
        mine = {o["variant"]: o for o in outcomes if o["task"] == task}
        assert sorted(mine) == sorted(VARIANTS), task
        for variant, o in mine.items():
            assert o["status"] == o["expect"], (task, variant, o["message"])
        # Timings on a shared CPU move with its load, and eager is timed at another moment than either variant,
        # so no speedup is compared with 1.0; the fast variant of each task is 8-10x faster than its slow one,
        # a margin load does not close.
        assert mine["fast"]["speedup_vs_eager"] > mine["slow"]["speedup_vs_eager"], (task, mine["fast"], mine["slow"])
        assert "unrecognized command-line option" in mine["compile_error"]["message"]
        best = json.loads((out / "best" / f"{task.replace('/', '__')}.json").read_text())
        assert best["status"] == "correct" and best["retimed"]
    config = json.loads((out / "config.json").read_text())
    assert config["demo"] is True and config["plan"]["early_stop"] is False and config["generator_info"]["kind"] == "replay"


@pytest.mark.slow
def test_report_json_and_plot_from_the_demo_run(demo_run, tmp_path):
    out, _, env = demo_run
    plot, table = tmp_path / "pass.png", tmp_path / "tasks.csv"
    res = subprocess.run([sys.executable, "-m", "search.cli", "report", str(out), "--json", "--plot", str(plot),
                          "--csv", str(table)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(res.stdout)  # with --json, stdout is the JSON object alone
    run = data["runs"][0]
    assert run["n"] == 6 and run["samples"] == 18 and run["correct"] == 6
    # each task: 2 correct of 6 -> pass@1 = 1/3, pass@k = 1 - C(4,k)/C(6,k), and fast_0.0@k is pass@k
    assert run["pass_at_k"]["1"] == pytest.approx(1 / 3)
    assert run["pass_at_k"]["2"] == pytest.approx(1 - 6 / 15)
    assert run["pass_at_k"]["4"] == pytest.approx(1 - 1 / 15)
    assert run["pass_at_k"]["6"] == pytest.approx(1.0)
    assert run["fast_p_at_k"]["0.0"] == run["pass_at_k"]
    # at most one sample of a task (the fast one) beats eager: fast_1.0@1 <= 1/6, and it grows with k
    fast = [run["fast_p_at_k"]["1.0"][str(k)] for k in range(1, 7)]
    assert fast[0] <= 1 / 6 + 1e-9 and fast == sorted(fast)
    for task in DEMO_TASKS:
        t = run["tasks"][task]
        assert t["status_counts"] == {"correct": 2, "incorrect": 1, "compile_error": 1, "runtime_error": 1, "rejected": 1}
        assert t["best_retimed"] and t["best_speedup_vs_eager"] > 0
    tables = subprocess.run([sys.executable, "-m", "search.cli", "report", str(out)], capture_output=True, text=True,
                            cwd=ROOT, env=env, timeout=300)
    assert "pass@k [95% CI]" in tables.stdout and "tasks of run" in tables.stdout
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 10_000
    assert len(table.read_text().splitlines()) == 1 + len(DEMO_TASKS)
