"""benchmarks/throughput.py's summary of a run folder, without a run: it reads the folder through the one
reader of samples.jsonl (so a verdict recorded before its task's compile baseline has the baseline), and
counts what a GPU run's table is made of (verdicts as expected, device and queue seconds, builds)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from oracle.candidate import Candidate
from oracle.extract import extract
from oracle.verdict import Verdict
from search.store import CompileBaseline, RunStore, SampleRecord

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import throughput  # noqa: E402


def record(task: str, path: Path, index: int, status: str, duplicate_of: int | None = None, **verdict) -> SampleRecord:
    candidate = Candidate.make(task, extract(path.read_text(), "auto").source, "cpp")
    v = Verdict(task, status, status, backend="cpp", hash=candidate.hash, **verdict)
    return SampleRecord(task, "zero-shot", 0, index, index, index, status, verdict=v, candidate=candidate,
                        duplicate_of=duplicate_of, recorded_at=1000.0 + 10 * index)


def test_the_summary_counts_a_run_folder_through_the_one_reader(tmp_path):
    files = throughput.candidate_files("cpu")
    expected, _ = throughput.write_replay(files, tmp_path / "corpus.jsonl")
    (task, right), (task2, wrong) = files[:2]  # both expected correct
    store = RunStore.create(tmp_path / "run", {"startup_s": {"tasks": 1.0, "ray": 2.0, "engine": 3.0},
                                               "oracles_started": [{"ready_at": 1019.2, "init_s": {}}],
                                               "oracles_device": [{"alive_s": 9.0, "first_evaluate_at": 1027.5}]})
    timed = dict(time_ms=1.0, build_s=20.0, device_s={"checks": 1.0, "timing": 0.5, "waiting": 9.0},
                 queued_s={"build": 0.1, "device": 4.0})
    store.append(record(task, right, 0, "correct", **timed))
    store.append(record(task, right, 1, "correct", duplicate_of=0, **timed))  # the same verdict: not counted
    store.append(record(task2, wrong, 2, "incorrect", build_s=30.0, device_s={"checks": 3.0},
                        queued_s={"build": 0.3, "device": 6.0}))  # judged otherwise than expected
    store.append_baseline(CompileBaseline(task, {"median_ms": 2.0}, None, 1005.0))
    s = throughput.summarize(store.root, expected, started=1000.0)
    assert s["candidates"] == 2 and s["wall_s"] == 20.0 and s["per_min"] == pytest.approx(6.0)
    assert s["as_expected"] == 1
    mine = next(v for v in s["verdicts"] if v["task"] == task)
    assert mine["as_expected"] and mine["file"].endswith(right.name)
    assert mine["speedup_vs_compile"] == pytest.approx(2.0)  # the baseline recorded after it reaches it
    assert next(v for v in s["verdicts"] if v["task"] == task2)["speedup_vs_compile"] is None
    assert s["device_s_p95"] == pytest.approx(3.0) and min(v["device_s"]["checks"] for v in s["verdicts"]) == 1.0
    assert s["phases_sum"]["waiting"] == 9.0  # kept by phase, left out of the candidate's device seconds
    assert s["queued_p50"] == {"build": 0.1, "device": 4.0} and s["queued_p90"] == {"build": 0.3, "device": 6.0}
    assert s["startup"]["ray"] == 2.0 and (s["build_p50_s"], s["build_p90_s"]) == (20.0, 30.0)  # nearest rank
    assert s["startup"]["oracles_ready_at_s"] == [19.2] and s["startup"]["first_evaluate_at_s"] == [27.5]
    # the tail: after the last verdict (at 20 s) the best kernel re-timed at 31 s, no baseline left to wait for
    assert s["tail"] == {"last_verdict_at_s": 20.0, "bests": 0, "bests_retimed": 0, "last_best_at_s": None,
                         "baselines_after_last_verdict": 0, "last_baseline_at_s": 5.0,
                         "best_reference_memory_wait_s": None}
    store.write_best(task, right.read_text(), {"status": "correct", "retimed_at": 1031.0,
                                               "queued_s": {"device": 40.0, "reference_memory": 12.5}})
    store.write_best(task2, wrong.read_text(), {"status": "correct", "retimed": False})  # its own verdict kept
    store.append_baseline(CompileBaseline(task2, {"median_ms": 3.0}, None, 1025.0))
    assert throughput.summarize(store.root, expected, started=1000.0)["tail"] == {
        "last_verdict_at_s": 20.0, "bests": 2, "bests_retimed": 1, "last_best_at_s": 31.0, "baselines_after_last_verdict": 1,
        "last_baseline_at_s": 25.0, "best_reference_memory_wait_s": [0.0, 12.5]}


def test_the_summary_says_how_many_candidates_were_on_the_device_at_once():
    def judged(end: float, verify: float, timing: float = 0.0) -> dict:
        return {"recorded_at": 100.0 + end, "verify_s": verify, "time_s": timing}

    # checks and timing over [0, 2], [1, 3] and [5, 6] after the start: two at once for one second of six
    d = throughput.on_device([judged(2, 1.5, 0.5), judged(3, 2.0), judged(6, 0.5, 0.5), {"recorded_at": 101.0}],
                             started=100.0)
    assert d == {"mean": pytest.approx(5 / 6, abs=1e-3), "most": 2, "share_at_most_one": pytest.approx(5 / 6, abs=1e-3),
                 "span_s": 6.0}
    # one after another, as four device slots held by candidates waiting before their checks look
    serial = throughput.on_device([judged(k + 1, 1.0) for k in range(4)], started=100.0)
    assert serial["most"] == 1 and serial["share_at_most_one"] == 1.0 and serial["mean"] == 1.0
    assert throughput.on_device([], started=100.0)["most"] == 0


def test_the_profiling_sessions_are_counted_by_what_they_recorded():
    judged = [{"timing": {"profile_sessions": [[1, 3, 3]]}},
              {"timing": {"profile_sessions": [[0, 1, 4], [2, 5, 5]]}},
              {"timing": {"profile_sessions": [[0, 0, 3]] * 3}, "flags": ["kernels_unseen"]},
              {"timing": {}}, {}]
    assert throughput.profile_sessions(judged) == {"profiled": 3, "retried": 2, "sessions_losing_fillers": 4,
                                                   "kernels_unseen": 1}
