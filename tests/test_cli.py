"""The command line as a user runs it: listings, selection, and one-line errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def kernelsearch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "search.cli", *args], capture_output=True, text=True, cwd=ROOT, timeout=600)


def test_tasks_json_builtin():
    out = kernelsearch("tasks", "--json", "--device", "cpu")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert len(rows) >= 8 and all({"id", "level", "problem_id", "name", "input_mb"} <= set(r) for r in rows)


def test_tasks_json_kernelbench_counts(kernelbench_jsonl):
    everything = json.loads(kernelsearch("tasks", "--source", str(kernelbench_jsonl), "--json", "--device", "cpu").stdout)
    assert len(everything) == 250
    some = json.loads(kernelsearch("tasks", "--source", str(kernelbench_jsonl), "--level", "2", "--ids", "1-10",
                                   "--json", "--device", "cpu").stdout)
    assert len(some) == 10 and {r["level"] for r in some} == {2}


def test_bad_flags_give_one_line_errors():
    for args, words in [
        (("tasks", "--ids", "x-1"), "--ids"),
        (("tasks", "--source", "/no/such/place"), "no such file"),
        (("tasks", "--device", "tpu"), "--device"),
        (("eval", "builtin/none", "README.md", "--device", "cpu"), "not in builtin"),
        (("run", "--generator", "nonsense", "--out", "/tmp/x-never"), "not one of"),
        (("report", "/no/such/run"), "no such run folder"),
        (("eval", "builtin/1_LeakyReLU_Scale", "README.md", "--tolerance", "loose", "--device", "cpu"), "--tolerance"),
        (("run", "--generator", "nonsense", "--out", "/tmp/x-never", "--tolerance", "loose"), "--tolerance"),
        (("report", "/no/such/run", "--tolerance", "loose"), "--tolerance"),
    ]:
        out = kernelsearch(*args)
        assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
        assert words in out.stderr


def test_strategies_lists_each_with_a_line():
    out = kernelsearch("strategies")
    assert out.returncode == 0 and "zero-shot" in out.stdout


def one_line_error(out: subprocess.CompletedProcess) -> str:
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    return lines[0]


def test_flag_errors_of_the_framework_are_one_line_too():
    line = one_line_error(kernelsearch("run", "-n", "0"))
    assert "'-n'" in line and "greater than or equal to 1" in line and "`kernelsearch run --help`" in line
    assert "No such option: --nope" in one_line_error(kernelsearch("tasks", "--nope"))
    assert "Missing argument" in one_line_error(kernelsearch("eval", "builtin/1_LeakyReLU_Scale"))


def test_an_unknown_task_for_eval_is_reported_once():
    line = one_line_error(kernelsearch("eval", "builtin/none", "README.md", "--device", "cpu"))
    assert "builtin/none" in line


def test_version_and_counted_nouns():
    out = kernelsearch("--version")
    assert out.returncode == 0 and out.stdout.startswith("kernelsearch ")
    one = kernelsearch("tasks", "--tasks", "builtin/3_Softmax_Rows", "--device", "cpu")
    assert one.returncode == 0 and "1 task from builtin" in one.stdout


def test_ids_and_help_are_whole_when_the_output_is_not_a_terminal():
    out = kernelsearch("tasks", "--device", "cpu")  # stdout is a pipe here
    ids = [row["id"] for row in json.loads(kernelsearch("tasks", "--json", "--device", "cpu").stdout)]
    assert out.returncode == 0 and "…" not in out.stdout
    assert all(task_id in out.stdout for task_id in ids)
    help_text = " ".join(kernelsearch("run", "--help").stdout.split())
    assert "openai:URL[#model]" in help_text and "…" not in help_text


@pytest.mark.slow
def test_eval_judges_under_the_asked_tolerance_policy():
    out = kernelsearch("eval", "builtin/1_LeakyReLU_Scale", "tests/candidates/leaky_torch.py", "--allow-torch",
                       "--tolerance", "numeric", "--max-input-mb", "4", "--device", "cpu", "--json")
    verdict = json.loads(out.stdout)
    assert verdict["status"] == "correct" and verdict["tolerance"] == "numeric", out.stderr
    assert verdict["passes"] == ["kernelbench", "kernelbench-v0.1", "numeric"]
    assert verdict["errors"]["ref32_rel_l2_64"] is not None and verdict["errors"]["over_bound"]["numeric"] <= 1


def test_run_fits_its_tasks_beside_rays_start_and_fails_a_bad_selection_before_it(tmp_path, monkeypatch):
    """Fitting tasks (seconds where torch imports slowly) overlaps Ray's start; a bad source or an empty
    selection is known from reading alone, so it fails before Ray starts."""
    import threading

    from typer.testing import CliRunner

    import search.cli as cli
    import search.runner as runner
    from tasks import LoadResult

    replay = tmp_path / "r.jsonl"
    replay.write_text(json.dumps({"task": "builtin/1_LeakyReLU_Scale", "completion": "x"}) + "\n")
    fitting, ray_asked, seen = threading.Event(), threading.Event(), []

    def fit(selected, budget):
        fitting.set()
        seen.append(("fit saw Ray asked", ray_asked.wait(30)))
        return LoadResult()

    def start_ray(address, device):
        ray_asked.set()
        seen.append(("Ray saw fitting", fitting.wait(30)))
        raise RuntimeError("Ray is not started in this test")

    monkeypatch.setattr(cli, "fit_selected", fit)
    monkeypatch.setattr(runner, "start_ray", start_ray)
    run = ["run", "--generator", f"replay:{replay}", "-n", "1", "--device", "cpu", "--out", str(tmp_path / "run")]
    for flags, words in ((["--source", "/no/such/place"], "no such file"), (["--tasks", "builtin/none"], "no tasks selected")):
        res = CliRunner().invoke(cli.app, [*run, *flags])
        assert res.exit_code == 2 and words in res.output, res.output
    assert not ray_asked.is_set() and not fitting.is_set()
    res = CliRunner().invoke(cli.app, run)
    assert res.exit_code == 2 and "error: Ray is not started in this test" in res.output, res.output
    assert _until_true(lambda: len(seen) == 2)
    assert sorted(seen) == [("Ray saw fitting", True), ("fit saw Ray asked", True)]


def _until_true(condition, timeout_s: float = 30.0) -> bool:
    import time

    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()
