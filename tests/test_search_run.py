"""The search engine end to end on the CPU: replay generator, Ray, a CPU oracle actor, the run store,
early stop, de-duplication, SIGKILL and resume, and an oracle actor killed mid-run."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from search.generators.base import SampleRequest
from search.generators.replay import ReplayGenerator
from search.store import OracleDevice, SampleRecord, read_samples

ROOT = Path(__file__).resolve().parent.parent
CANDIDATES = ROOT / "tests" / "candidates"
TASK = "builtin/1_LeakyReLU_Scale"


def write_replay(path: Path, names: list[str]) -> Path:
    with open(path, "w") as f:
        for name in names:
            text = (CANDIDATES / f"leaky_{name}.py").read_text() if name != "prose" else "No code today, sorry."
            f.write(json.dumps({"task": TASK, "completion": f"Here is my kernel:\n```python\n{text}\n```\n", "tokens": 100}) + "\n")
    return path


def kernelsearch(*args: str, env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "search.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env or os.environ.copy(), timeout=timeout)


def records(run: Path) -> list[SampleRecord]:
    return read_samples(run / "samples.jsonl")


async def collect(gen, request):
    return [c async for c in gen.sample(request)]


def test_replay_draws_without_replacement_then_wraps(tmp_path):
    path = write_replay(tmp_path / "r.jsonl", ["correct", "wrong_slope", "prose"])
    gen = ReplayGenerator(path, seed=3)
    req = SampleRequest("r1", TASK, [], seeds=list(range(6)), samples=list(range(6)))
    texts = [c.text for c in asyncio.run(collect(gen, req))]
    assert len(set(texts[:3])) == 3 and texts[3:] == texts[:3]
    assert sorted(gen.order(TASK)) == [0, 1, 2] and ReplayGenerator(path, seed=3).order(TASK) == gen.order(TASK)
    missing = asyncio.run(collect(gen, SampleRequest("r2", "builtin/none", [], seeds=[1])))
    assert missing[0].error and not missing[0].text


def test_replay_names_its_bad_lines_and_reads_a_run_of_either_record_format(tmp_path):
    from search.generators.replay import read_replay

    path = write_replay(tmp_path / "r.jsonl", ["correct", "prose"])
    with open(path, "a") as f:
        f.write('not json\n["a list"]\n{"task": "builtin/x"}\n\n')
        f.write(json.dumps({"task": TASK, "completion": "no newline at the end"}))  # a hand-written last line
    found = read_replay(path)
    assert found.tasks == [TASK] and len(found.by_task[TASK]) == 3
    assert found.skipped == ["line 3 is not valid JSON (Expecting value), skipped",
                             "line 4 has no `task` and `completion` text, skipped",
                             "line 5 has no `task` and `completion` text, skipped"]
    # a run's samples.jsonl, flat (before SampleRecord) or nested, replays with its recorded token counts
    old = read_replay(ROOT / "tests" / "fixtures" / "run_v1" / "samples.jsonl")
    assert old.skipped == [] and len(old.by_task[TASK]) == 4
    record = records(ROOT / "tests" / "fixtures" / "run_v1")[0]
    record.tokens_in, record.tokens_out = 7, 9
    (tmp_path / "new.jsonl").write_text(json.dumps(record.to_json()) + "\n")
    gen = ReplayGenerator(tmp_path / "new.jsonl")
    (c,) = asyncio.run(collect(gen, SampleRequest("r", TASK, [], seeds=[1])))
    assert (c.text, c.tokens, c.prompt_tokens) == (record.completion, 9, 7)


def test_a_bad_generator_fails_before_anything_starts(tmp_path):
    for spec, words in (("replay:/no/such/file.jsonl", "does not exist"), ("nonsense", "not one of")):
        res = kernelsearch("run", "--generator", spec, "--out", str(tmp_path / "x"), "--device", "cpu", timeout=120)
        assert res.returncode == 2 and res.stderr.strip().splitlines() == [res.stderr.strip()], res.stderr
        assert res.stderr.startswith("error: ") and words in res.stderr and "GeneratorError" not in res.stderr
    assert not (tmp_path / "x").exists()


def test_replay_runs_the_tasks_its_file_names_when_none_are_selected(tmp_path):
    replay = tmp_path / "r.jsonl"
    replay.write_text(json.dumps({"task": "builtin/none", "completion": "x"}) + "\n")
    res = kernelsearch("run", "--generator", f"replay:{replay}", "-n", "1", "--out", str(tmp_path / "x"),
                       "--device", "cpu", timeout=300)
    assert "tasks: the 1 task that replay:" in res.stderr and "unknown task builtin/none" in res.stderr
    assert res.returncode == 2 and "error: no tasks selected" in res.stderr


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    return dict(os.environ, KERNELSEARCH_CACHE=str(cache), PYTHONUNBUFFERED="1")


@pytest.mark.slow
def test_run_replay_end_to_end_with_dedup_and_best(tmp_path, env):
    replay = write_replay(tmp_path / "r.jsonl", ["correct", "wrong_slope", "prose", "segfault"])
    with open(replay, "a") as f:
        f.write("not json\n")  # named and skipped; the run goes on
    out = tmp_path / "run"
    # eager timed in this run, not read from the module's cache: its one correct kernel's verdict then stands
    shutil.rmtree(Path(env["KERNELSEARCH_CACHE"]) / "baselines", ignore_errors=True)
    # no task selection: the tasks the replay file names (one), not every task of the source
    scratch = Path(tempfile.mkdtemp(prefix="ks-t"))  # the run's temporary folders (short: Ray's sockets live there)
    res = kernelsearch("run", "--generator", f"replay:{replay}", "-n", "6", "--no-early-stop",
                       "--device", "cpu", "--out", str(out), env=dict(env, TMPDIR=str(scratch)))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "tasks: the 1 task that replay:" in res.stderr and "line 5 is not valid JSON" in res.stderr
    left = sorted(p.name for p in scratch.glob("ks-worker-*"))  # workers on standby included: closed at the end
    shutil.rmtree(scratch, ignore_errors=True)
    assert not left, left
    rows = records(out)
    assert len(rows) == 6 and sorted(r.chain for r in rows) == list(range(6))
    statuses = {r.status for r in rows}
    assert {"correct", "incorrect", "no_code", "runtime_error"} <= statuses
    dups = [r for r in rows if r.duplicate_of is not None]
    assert len(dups) == 2 and all(r.build_s == 0.0 and r.oracle_device_s == 0.0 for r in dups)  # 6 samples of 4
    # the record carries the whole verdict and the judged source, so a verdict can be audited from the log
    correct = next(r for r in rows if r.correct and r.duplicate_of is None)
    assert correct.verdict.timing["candidate"]["median_ms"] > 0 and correct.verdict.device == "cpu"
    assert "class ModelNew" in correct.source and correct.candidate.backend == "cpp"
    assert correct.oracle_device_s == pytest.approx(correct.verdict.verify_s + correct.verdict.time_s)
    assert correct.verdict.device_s.get("timing", 0) > 0  # the oracle's own accounting, by phase
    assert {"build", "device", "reference"} <= set(correct.verdict.queued_s)  # and what it waited for
    assert all(r.tokens_out == 100 and r.generation_s is not None for r in rows)
    line = json.loads((out / "samples.jsonl").read_text().splitlines()[0])
    assert line["schema"] == 2 and {"verdict", "candidate", "completion", "tokens_in", "tokens_out"} <= set(line)
    config = json.loads((out / "config.json").read_text())
    assert config["plan"]["n"] == 6 and config["tasks"][0]["id"] == TASK and config["generator_info"]["kind"] == "replay"
    # what came before the search, read back: this invocation's start, and when the oracle was ready
    assert set(config["startup_s"]) == {"tasks", "ray", "engine"} and config["startup_s"]["ray"] > 0
    (oracle,) = config["oracles_started"]
    assert oracle["ready_at"] > config["started_at"] - 120 and {"oracle", "gpu query", "device memory"} <= set(oracle["init_s"])
    # and, recorded at the run's end, where the oracle's device time went: what held it alone, how often
    (device,) = [OracleDevice.from_json(d) for d in config["oracles_device"]]
    # one correct kernel, timed once, against eager timed once: no re-timing (docs/oracle.md, rule 18)
    assert device.exclusive_times["candidate timing"] == 1 and device.exclusive_times["eager baseline"] == 1
    assert 0 < device.exclusive_s <= device.busy_s <= device.alive_s and device.phases_s["timing"] > 0
    assert oracle["ready_at"] <= device.first_evaluate_at <= time.time()  # the first candidate came once it was up
    assert device.exclusive_s == pytest.approx(sum(device.exclusive_by.values()), abs=0.05)
    best = json.loads((out / "best" / "builtin__1_LeakyReLU_Scale.json").read_text())
    assert best["status"] == "correct" and best["retimed"] is False and "only correct kernel" in best["not_retimed"]
    assert best["hash"] == correct.hash and best["speedup_vs_eager"] == correct.verdict.speedup_vs_eager
    assert "ModelNew" in (out / "best" / "builtin__1_LeakyReLU_Scale.py").read_text()


@pytest.mark.slow
def test_early_stop_cancels_the_rest(tmp_path, env):
    # Five different correct kernels (they differ by a comment): the first verdict stops the task, and the
    # ones still queued for the oracle are dropped, not judged.
    correct = (CANDIDATES / "leaky_correct.py").read_text()
    with open(tmp_path / "r.jsonl", "w") as f:
        for i in range(5):
            f.write(json.dumps({"task": TASK, "completion": f"```python\n# variant {i}\n{correct}```"}) + "\n")
    out = tmp_path / "run"
    res = kernelsearch("run", "--tasks", TASK, "--generator", f"replay:{tmp_path / 'r.jsonl'}", "-n", "5",
                       "--target-speedup", "0.01", "--device", "cpu", "--out", str(out), env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = records(out)
    judged = [r for r in rows if r.status == "correct"]
    cancelled = [r for r in rows if r.status == "cancelled"]
    # A CPU oracle on 2 cores has one build slot and one timing slot: at most 2 were in flight at the stop.
    assert 1 <= len(judged) <= 2 and len(cancelled) == 5 - len(judged)
    assert json.loads((out / "config.json").read_text())["plan"]["early_stop"] is True


@pytest.mark.slow
def test_sigkill_then_resume_records_every_sample_once(tmp_path, env):
    replay = write_replay(tmp_path / "r.jsonl", ["correct", "wrong_slope", "raises", "prose", "wrong_shape", "returns_input"])
    out = tmp_path / "run"
    args = [sys.executable, "-m", "search.cli", "run", "--tasks", TASK, "--generator", f"replay:{replay}", "-n", "6",
            "--no-early-stop", "--device", "cpu", "--out", str(out)]
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 600
    while time.time() < deadline and (not (out / "samples.jsonl").exists() or len(records(out)) < 2):
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = records(out)
    assert 2 <= len(before) < 6
    res = kernelsearch("run", "--resume", str(out), env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    after = records(out)
    keys = [(r.round, r.chain) for r in after]
    assert len(after) == 6 and len(set(keys)) == 6
    assert after[: len(before)] == before


@pytest.mark.slow
def test_oracle_actor_killed_mid_run_and_the_run_finishes(tmp_path, env, monkeypatch):
    import asyncio

    import ray

    from search.controller import SearchPlan
    from search.runner import RunSettings, build_engine, make_config, run_search, start_ray
    from search.store import RunStore
    from tasks import Selection, load_tasks

    monkeypatch.setenv("KERNELSEARCH_CACHE", env["KERNELSEARCH_CACHE"])
    replay = write_replay(tmp_path / "r.jsonl", ["infinite_loop", "correct", "wrong_slope"])
    tasks = load_tasks("builtin", Selection(task_ids=frozenset({TASK})), 256).tasks
    settings = RunSettings(generator=f"replay:{replay}", strategy="zero-shot", device="cpu",
                           plan=SearchPlan(n=3, early_stop=False, seed=1))
    resources = start_ray(None, "cpu")
    store = RunStore.create(tmp_path / "run", make_config(settings, tasks, {}, resources))
    killed: list[int] = []

    async def main():
        engine = await build_engine(settings)
        pid = (await engine.pool.stats())[0]["pid"]
        search = asyncio.create_task(run_search(settings, tasks, store, engine=engine))
        # Once the oracle is busy (the hanging candidate sits in its call), kill the actor's process:
        # Ray restarts it and the sample in flight is recorded once as failed.
        while not search.done() and not killed:
            await asyncio.sleep(0.5)
            stats = (await engine.pool.stats())[0]
            if stats.get("timing"):
                await asyncio.sleep(3.0)
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        await search

    asyncio.run(main())
    rows = records(tmp_path / "run")
    assert killed and len(rows) == 3
    assert any("oracle_died" in r.flags for r in rows)
    assert len({(r.round, r.chain) for r in rows}) == 3
    ray.shutdown()
