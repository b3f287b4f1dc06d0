"""benchmarks/tolerance_table.py without a GPU: its candidate files parse, are CUDA candidates as the oracle
extracts them, and name tasks of the KernelBench dataset (the GPU run must not fail on any of that)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from oracle.candidate import Candidate
from oracle.extract import candidate_from_completion
from oracle.tolerance import POLICIES
from oracle.verdict import STATUSES

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import tolerance_table  # noqa: E402


def test_candidate_files_parse_extract_and_name_dataset_tasks(kernelbench_jsonl):
    candidates = tolerance_table.read_candidates()
    assert len(candidates) >= 10
    tasks = tolerance_table.load_tasks_for(candidates, kernelbench_jsonl, 256)
    for c in candidates:
        assert set(c.expected) == set(POLICIES) and set(c.expected.values()) <= set(STATUSES), c.name
        assert c.what, c.name
        found = candidate_from_completion(tasks[c.task_id], c.text, "auto", "cuda")
        assert isinstance(found, Candidate) and found.backend == "cuda", c.name
        sources = tolerance_table.cuda_sources(c.text)
        assert sources and all("__global__" in s for s in sources), c.name
    statuses = {tuple(c.expected[p] for p in POLICIES) for c in candidates}
    assert ("incorrect", "correct", "incorrect") in statuses  # one that only kernelbench-v0.1 lets through
    assert any("constants" in c.what for c in candidates)


def test_a_malformed_header_names_the_file(tmp_path):
    bad = tmp_path / "x.py"
    bad.write_text("# expected: kernelbench=correct - too few\n# task: level1/19_ReLU\n")
    with pytest.raises(ValueError, match="x.py"):
        tolerance_table.read_candidate(bad)
