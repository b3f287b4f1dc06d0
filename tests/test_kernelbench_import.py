"""`kernelsearch import kernelbench`: a KernelBench run folder becomes a replay file that resolves against the
task source, one line a kernel with its sample number."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from search.generators.replay import ReplayGenerator
from search.kernelbench_import import import_run, write_replay

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "kernelbench" / "kernelbench_levels1-3.jsonl"
pytestmark = pytest.mark.skipif(not DATA.exists(), reason="KernelBench data not found")


def kb_run(folder: Path) -> Path:
    (folder / "sub").mkdir(parents=True)
    (folder / "level_1_problem_19_sample_0_kernel.py").write_text("# relu sample 0\nclass ModelNew: pass\n")
    (folder / "level_1_problem_19_sample_1_kernel.py").write_text("# relu sample 1\nclass ModelNew: pass\n")
    (folder / "sub" / "level_2_problem_12_sample_3_kernel.py").write_text("# gemm sample 3\n")
    (folder / "level_9_problem_1_sample_0_kernel.py").write_text("# no such level\n")
    (folder / "notes.py").write_text("# not a kernel file\n")
    return folder


def test_import_round_trips_into_a_replay_file(tmp_path):
    result = import_run(kb_run(tmp_path / "run"), str(DATA))
    assert [(k.task, k.sample) for k in result.kernels] == [
        ("level1/19_ReLU", 0), ("level1/19_ReLU", 1), ("level2/12_Gemm_Multiply_LeakyReLU", 3)]
    assert len(result.skipped) == 1 and "level 9 problem 1" in result.skipped[0][1]
    out = tmp_path / "replay.jsonl"
    write_replay(result, out)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[1]["completion"] == "# relu sample 1\nclass ModelNew: pass\n" and lines[1]["sample"] == 1
    replay = ReplayGenerator(out)
    assert sorted(replay.by_task) == ["level1/19_ReLU", "level2/12_Gemm_Multiply_LeakyReLU"]
    assert len(replay.by_task["level1/19_ReLU"]) == 2


def test_the_command_writes_the_file_and_says_how_to_judge_it(tmp_path):
    run = kb_run(tmp_path / "run")
    out = tmp_path / "r.jsonl"
    res = subprocess.run([sys.executable, "-m", "search.cli", "import", "kernelbench", str(run), "--source", str(DATA),
                          "-o", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert "3 kernel(s) for 2 task(s)" in res.stdout and "--generator replay:" in res.stdout
    assert "skipped" in res.stderr and len(out.read_text().splitlines()) == 3
    empty = subprocess.run([sys.executable, "-m", "search.cli", "import", "kernelbench", str(tmp_path / "nothing"),
                            "--source", str(DATA), "-o", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert empty.returncode == 2 and empty.stderr.count("\n") == 1 and "is not a folder" in empty.stderr
