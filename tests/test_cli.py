"""The command line as a user runs it: listings, selection, and one-line errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
    ]:
        out = kernelsearch(*args)
        assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
        assert words in out.stderr


def test_strategies_lists_each_with_a_line():
    out = kernelsearch("strategies")
    assert out.returncode == 0 and "zero-shot" in out.stdout
