"""The run record: `SampleRecord` and its one reader (either format, a torn last line), `RunSettings` to and
from config.json, the stop rule, and resume through the controller with a stub generator and oracle."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from oracle.candidate import Candidate
from oracle.protocol import MemoryPeak
from oracle.verdict import NOT_JUDGED, SAMPLE_STATUSES, STATUSES, WORKER_STATUSES, Verdict, is_judged
from search.controller import Controller, SearchPlan, timing_stands
from search.stop import StopRule
from search.store import CompileBaseline, OracleDevice, RunStore, SampleRecord, StoreError, read_samples
from strategies import make_strategy
from tests.test_strategies import LEAKY, StubGenerator, StubPool, load

FIXTURE_V1 = Path(__file__).resolve().parent / "fixtures" / "run_v1"


def judged_record(**fields) -> SampleRecord:
    source = "import torch\nclass ModelNew(torch.nn.Module):\n    pass"
    candidate = Candidate.make(LEAKY, source, "cpp")
    verdict = Verdict(LEAKY, "correct", "correct; 1 ms", backend="cpp", hash=candidate.hash, time_ms=1.0, eager_ms=2.0,
                      speedup_vs_eager=2.0, build_s=3.0, verify_s=0.5, time_s=1.5, flags=["constant_reference"],
                      timing={"candidate": {"median_ms": 1.0, "spread": 0.01}}, sizes={"dim": 8}, sol_ms=0.1,
                      sol_fraction=0.1)
    values = dict(task=LEAKY, strategy="zero-shot", round=1, chain=2, sample_index=6, seed=9, status="correct",
                  verdict=verdict, candidate=candidate, completion=f"```python\n{source}\n```", tokens_in=50,
                  tokens_out=70, generation_s=4.5, finish_reason="stop", replica=1,
                  oracle_device_s=verdict.candidate_device_s,
                  messages=[{"role": "user", "content": "hi"}], recorded_at=1.0)
    return SampleRecord(**{**values, **fields})


def test_the_status_vocabulary_is_one():
    assert "unsupported" in STATUSES and "cancelled" not in STATUSES and SAMPLE_STATUSES[-1] == "cancelled"
    assert NOT_JUDGED == {"unsupported", "cancelled"} and not is_judged("unsupported") and is_judged("no_code")
    assert WORKER_STATUSES < set(STATUSES)
    Verdict(LEAKY, "unsupported", "Triton is not installed here")  # a verdict like any other
    with pytest.raises(ValueError):
        Verdict(LEAKY, "cancelled", "")


def test_a_record_round_trips_with_its_whole_verdict_and_candidate(tmp_path):
    record = judged_record()
    store = RunStore.create(tmp_path / "run", {})
    store.append(record)
    store.append(judged_record(chain=3, sample_index=7, duplicate_of=6, oracle_device_s=0.0))
    line = json.loads((tmp_path / "run" / "samples.jsonl").read_text().splitlines()[0])
    assert line["schema"] == 2 and line["verdict"]["timing"]["candidate"]["spread"] == 0.01
    assert line["candidate"]["source"] == record.source and line["verdict"]["sol_ms"] == 0.1
    back, dup = store.samples()
    assert back == record
    assert (back.tokens_in, back.tokens_out, back.generation_s, back.oracle_device_s) == (50, 70, 4.5, 2.0)
    assert (back.round, back.chain, back.key) == (1, 2, (LEAKY, 6))
    assert back.attempt().source == record.source and back.attempt().speedup_vs_eager == 2.0
    assert (back.build_s, dup.build_s, dup.verify_s) == (3.0, 0.0, None)  # a duplicate reused the build


def test_a_cancelled_record_has_no_verdict_and_a_status_matches_its_verdict():
    cancelled = SampleRecord(LEAKY, "zero-shot", 0, 0, 0, 1, "cancelled", completion="text")
    assert cancelled.message.startswith("the task had stopped") and not cancelled.judged and cancelled.hash is None
    with pytest.raises(ValueError):
        SampleRecord(LEAKY, "zero-shot", 0, 0, 0, 1, "correct")  # no verdict
    with pytest.raises(ValueError):
        judged_record(status="incorrect")  # a correct verdict


def test_the_reader_reads_the_flat_records_of_before(tmp_path):
    records = read_samples(FIXTURE_V1 / "samples.jsonl")
    assert [r.status for r in records] == ["no_code", "incorrect", "correct", "correct"]
    first, dup = records[2], records[3]
    assert (first.chain, first.sample_index, first.tokens_out) == (None, 0, 100)  # no chain recorded then
    assert "class ModelNew" in first.source and first.candidate.hash == first.verdict.hash == dup.hash
    assert first.oracle_device_s == pytest.approx(first.verdict.verify_s + first.verdict.time_s)
    assert dup.duplicate_of == 0 and dup.oracle_device_s == 0.0 and dup.build_s == 0.0
    assert records[0].candidate is None and records[0].message.startswith("no Python code block")


def test_a_resumed_old_run_mixes_both_formats_in_one_file(tmp_path):
    lines = (FIXTURE_V1 / "samples.jsonl").read_text()
    (tmp_path / "samples.jsonl").write_text(lines + json.dumps(judged_record().to_json()) + "\n")
    records = read_samples(tmp_path / "samples.jsonl")
    assert len(records) == 5 and records[-1] == judged_record() and records[0].status == "no_code"


def test_one_policy_for_a_torn_last_line_and_bad_lines_named(tmp_path):
    store = RunStore.create(tmp_path / "run", {})
    store.append(judged_record())
    with open(store.samples_path, "a") as f:
        f.write('{"schema": 2, "task": "x", "sta')  # torn by a crash
    assert len(read_samples(store.samples_path)) == 1  # not read (and the file is left as it is)
    assert store.samples_path.read_text().endswith('"sta')
    reopened = RunStore.open(tmp_path / "run")  # cut, so the next append starts its own line
    reopened.append(judged_record(chain=3, sample_index=7))
    assert len(reopened.samples()) == 2
    with open(store.samples_path, "a") as f:
        f.write('{"schema": 2, "task": "x"}\n')
    with pytest.raises(StoreError, match="line 3 is not a sample record"):
        store.samples()
    (tmp_path / "bad.jsonl").write_text('{"schema": 9}\n')
    with pytest.raises(StoreError, match="line 1 is not a sample record .*schema 9"):
        read_samples(tmp_path / "bad.jsonl")


def test_a_correct_sample_recorded_before_its_tasks_compile_baseline_reads_back_with_it(tmp_path):
    """A correct sample is recorded as judged; its task's torch.compile baseline, measured later, goes to
    baselines.jsonl, and the reader gives it to every correct sample of the task that lacks it."""
    store = RunStore.create(tmp_path / "run", {})
    store.append(judged_record())
    store.append(judged_record(sample_index=7, chain=3, status="incorrect",
                               verdict=Verdict(LEAKY, "incorrect", "wrong", backend="cpp")))
    (only, wrong) = store.samples()
    assert only.compile_ms is None and only.speedup_vs_compile is None and "torch.compile" not in only.message
    store.append_baseline(CompileBaseline(LEAKY, {"median_ms": 4.0, "spread": 0.01}, None, 2.0))
    store.append_baseline(CompileBaseline(LEAKY, {"median_ms": 9.0}, None, 3.0))  # the first of a task counts
    store.append_baseline(CompileBaseline("other/task", None, "torch.compile failed", 3.0))
    (only, wrong) = read_samples(store.samples_path)
    assert only.compile_ms == 4.0 and only.speedup_vs_compile == pytest.approx(4.0)
    assert "4.00x torch.compile" in only.message and only.verdict.timing["compile"]["spread"] == 0.01
    assert wrong.verdict.compile_ms is None and "compile" not in wrong.verdict.timing
    # a sample that came with its baseline keeps its own
    own = judged_record(sample_index=8, chain=4)
    own.verdict.timing["compile"] = {"median_ms": 1.0}
    own.verdict.compile_ms = 1.0
    store.append(own)
    assert store.samples()[2].compile_ms == 1.0


def test_a_torn_or_bad_baseline_line(tmp_path):
    store = RunStore.create(tmp_path / "run", {})
    store.append(judged_record())
    store.append_baseline(CompileBaseline(LEAKY, {"median_ms": 4.0}, None, 2.0))
    with open(store.baselines_path, "a") as f:
        f.write('{"task": "level1/x", "comp')  # a crash mid-line: never recorded
    assert store.samples()[0].compile_ms == 4.0 and set(store.baselines()) == {LEAKY}
    RunStore.open(store.root)  # resuming cuts the torn line, so the next one starts a line of its own
    assert store.baselines_path.read_text().endswith("}\n")
    with open(store.baselines_path, "a") as f:
        f.write('{"task": 3}\n')
    with pytest.raises(StoreError, match="baselines.jsonl: line 2 is not a baseline record"):
        store.samples()


def test_an_oracles_device_record_keeps_its_reference_process_memory_by_request():
    """What the oracle actor's stats say of its reference process's memory reaches config.json and reads
    back typed; a record written before the field existed reads back without it."""
    stats = {"alive_s": 10.0, "device_busy_s": 8.0, "device_exclusive_s": 2.0, "device_exclusive_by": {"eager baseline": [2.0, 3]},
             "device_phases_s": {"checks": 5.0}, "reference_peak_mb": 61000.0,
             "reference_peaks": {"prepare": {"reserved_mb": 30000.0, "allocated_mb": 27000.0},
                                 "time_eager": {"reserved_mb": 61000.0, "allocated_mb": 35000.0}},
             "first_evaluate_at": 1796592950.5}
    device = OracleDevice.of(stats)
    assert device.first_evaluate_at == 1796592950.5 and OracleDevice.of({}).first_evaluate_at is None
    assert device.reference_peaks["time_eager"] == MemoryPeak(61000.0, 35000.0)
    back = OracleDevice.from_json(json.loads(json.dumps(device.to_json())))
    assert back == device and back.reference_peak_mb == 61000.0
    old = {k: v for k, v in device.to_json().items() if k not in ("reference_peaks", "first_evaluate_at")}
    assert OracleDevice.from_json(old).reference_peaks == {} and OracleDevice.from_json(old).first_evaluate_at is None
    assert MemoryPeak(1.0, 5.0).merged(MemoryPeak(3.0, 2.0)) == MemoryPeak(3.0, 5.0)


def test_run_settings_to_and_from_config_json():
    from search.runner import RunSettings

    settings = RunSettings(generator="replay:x.jsonl", strategy="agents", device="cpu", gpus=None,
                           plan=SearchPlan(n=3, rounds=2, target_speedup=1.5, early_stop=False, seed=4),
                           max_input_mb=64.0, strategy_backend="cpp", strategy_options={"ambition": "full"},
                           generator_replicas=2, share_generator=True, address="10.0.0.1:6379", tolerance="numeric")
    data = json.loads(json.dumps(settings.to_json()))
    assert "address" not in data and data["strategy_options"] == {"backend": "cpp", "ambition": "full"}
    assert data["tolerance"] == "numeric"
    back = RunSettings.from_json(data, address="10.0.0.1:6379")
    assert back == settings
    # a config.json of a run made before to_json existed (it holds tasks, versions, hardware beside them)
    old = RunSettings.from_json(json.loads((FIXTURE_V1 / "config.json").read_text()))
    assert (old.generator, old.strategy, old.device, old.plan.n, old.plan.early_stop) == (
        "replay:/tmp/fx/replay.jsonl", "zero-shot", "cpu", 4, False)
    assert old.strategy_backend == "cuda" and old.strategy_options == {} and old.address is None
    assert old.tolerance == "kernelbench"  # runs before tolerance policies judged by today's default


def test_the_stop_rule():
    rule = StopRule(target_speedup=1.5, early_stop=True)
    assert rule.reached("correct", 1.5) and not rule.reached("correct", 1.49) and not rule.reached("incorrect", 9.0)
    assert rule.stops_task("correct", 2.0) and not rule.stops_task("correct", None)
    no_stop = StopRule(1.5, early_stop=False)
    assert no_stop.ends_chain("correct", 2.0) and not no_stop.stops_task("correct", 2.0)
    assert SearchPlan(n=1, target_speedup=3.0, early_stop=False).stop_rule == StopRule(3.0, False)


def run(store: RunStore, plan: SearchPlan, generator, pool) -> None:
    controller = Controller(plan, make_strategy("zero-shot", "cpp"), generator, pool, store, device="cpu")
    asyncio.run(asyncio.wait_for(controller.run([load(LEAKY)]), 60))


def test_resume_counts_earlier_samples_for_duplicates_the_best_and_the_stop(tmp_path):
    answers = {0: "A", 1: "B", 2: "A", 3: "B"}  # samples 2 and 3 repeat 0 and 1

    def answer(request, i):
        kind = answers[request.samples[i]]
        return f"```python\nimport torch\n# {kind}\nclass ModelNew(torch.nn.Module): pass\n```"

    judge = lambda source: ("correct", "correct", 0.5) if "# A" in source else ("incorrect", "wrong", None)  # noqa: E731
    plan = SearchPlan(n=4, seed=1, target_speedup=1.0)
    store = RunStore.create(tmp_path / "run", {"strategy": "zero-shot", "strategy_options": {"backend": "cpp"}})
    run(store, plan, StubGenerator(answer), StubPool(judge))
    full = store.samples()
    assert [r.duplicate_of for r in sorted(full, key=lambda r: r.sample_index)] == [None, None, 0, 1]
    # keep the first two samples only, as a run killed after them would have
    lines = store.samples_path.read_text().splitlines(keepends=True)
    first_two = sorted(range(4), key=lambda k: json.loads(lines[k])["sample_index"])[:2]
    store.samples_path.write_text("".join(lines[k] for k in first_two))
    (store.best_dir / "builtin__1_LeakyReLU_Scale.json").unlink()
    pool, generator = StubPool(judge), StubGenerator(answer)
    run(RunStore.open(tmp_path / "run"), plan, generator, pool)
    after = sorted(store.samples(), key=lambda r: r.sample_index)
    assert [r.sample_index for r in after] == [0, 1, 2, 3] and [r.duplicate_of for r in after] == [None, None, 0, 1]
    assert [r.oracle_device_s for r in after[2:]] == [0.0, 0.0]
    assert sum(len(r.seeds) for r in generator.requests) == 2  # only the two missing samples were generated
    assert store.best(LEAKY)["status"] == "correct"  # the best kernel came from a recorded sample


class StampedPool(StubPool):
    """A StubPool whose correct verdicts say when their eager baseline was timed (`eager_at()`), and which
    notes each re-timing it is asked for."""

    def __init__(self, judge, eager_at):
        super().__init__(judge)
        self.eager_at = eager_at
        self.retimed: list[str] = []

    async def evaluate(self, task, candidate, retime=False) -> Verdict:
        verdict = await super().evaluate(task, candidate, retime)
        if retime:
            self.retimed.append(candidate.hash)
        if verdict.correct:
            verdict.eager_measured_at = self.eager_at()
        return verdict


@pytest.mark.parametrize("kinds, eager_age_s, retimed", [
    ("AB", 0.0, False),  # one correct kernel, eager timed in this run: its own verdict stands
    ("AC", 0.0, True),  # the fastest of two correct kernels: re-timed
    ("AB", 3600.0, True),  # eager read from a disk cache filled before the run: re-timed
    ("AB", None, True),  # a baseline that does not say when it was timed: re-timed
])
def test_a_best_kernel_is_retimed_only_where_its_own_timing_could_be_biased(tmp_path, kinds, eager_age_s, retimed):
    speedups = {"A": 2.0, "B": None, "C": 1.5}

    def answer(request, i):
        return f"```python\nimport torch\n# {kinds[request.samples[i]]}\nclass ModelNew(torch.nn.Module): pass\n```"

    def judge(source):
        kind = source.split("# ")[1][0]
        return ("correct", "correct", speedups[kind]) if speedups[kind] else ("incorrect", "wrong", None)

    eager_at = (lambda: None) if eager_age_s is None else (lambda: time.time() - eager_age_s)
    pool = StampedPool(judge, eager_at)
    store = RunStore.create(tmp_path / "run", {"strategy": "zero-shot", "strategy_options": {"backend": "cpp"}})
    run(store, SearchPlan(n=2, seed=1, early_stop=False), StubGenerator(answer), pool)
    best = store.best(LEAKY)
    sample = next(r for r in store.samples() if r.correct and r.speedup_vs_eager == 2.0)
    assert best["status"] == "correct" and best["retimed"] is retimed and best["hash"] == sample.hash
    assert pool.retimed == ([sample.hash] if retimed else [])
    if not retimed:  # the sample's verdict, as recorded, and why it was not timed again
        assert best["speedup_vs_eager"] == sample.verdict.speedup_vs_eager and "only correct kernel" in best["not_retimed"]
        assert "retimed_at" not in best


def test_timing_stands_only_for_a_lone_kernel_against_this_runs_eager():
    verdict = Verdict(LEAKY, "correct", "ok", time_ms=1.0, eager_ms=2.0, eager_measured_at=100.0)
    assert timing_stands(1, verdict, run_started=99.0)
    assert not timing_stands(2, verdict, run_started=99.0)
    assert not timing_stands(1, verdict, run_started=101.0)
    verdict.eager_measured_at = None
    assert not timing_stands(1, verdict, run_started=0.0)


def test_a_run_from_before_resumes_its_missing_sample(tmp_path):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(FIXTURE_V1, run_dir)
    lines = (run_dir / "samples.jsonl").read_text().splitlines(keepends=True)
    (run_dir / "samples.jsonl").write_text("".join(lines[:3]))  # the duplicate (sample #4) was never recorded
    old = read_samples(run_dir / "samples.jsonl")
    correct = next(r for r in old if r.correct)
    store = RunStore.open(run_dir)
    config = store.config()
    generator = StubGenerator(lambda request, i: correct.completion)
    pool = StubPool(lambda source: pytest.fail("a known candidate was judged again"))
    plan = SearchPlan(**config["plan"])
    asyncio.run(asyncio.wait_for(
        Controller(plan, make_strategy("zero-shot", "cpp"), generator, pool, store).run([load(LEAKY)]), 60))
    records = store.samples()
    assert [r.sample_index for r in records] == [1, 2, 0, 3] and [len(r.seeds) for r in generator.requests] == [1]
    new = records[-1]
    assert new.duplicate_of == 0 and new.hash == correct.hash and new.verdict == correct.verdict
    assert json.loads((run_dir / "samples.jsonl").read_text().splitlines()[-1])["schema"] == 2
