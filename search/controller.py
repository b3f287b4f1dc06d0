"""The search controller: spreads n samples and refinement rounds over the generator and the oracle pool.

Per task it asks the strategy for messages, streams completions from the generator actor, extracts and
de-duplicates candidates by content hash, sends new ones to the oracle pool as they arrive, records every
sample in the run store, and stops the task when a verified-correct kernel reaches the target speedup
(or its budget is spent), cancelling the task's outstanding work. The best kernel is re-timed in a fresh
process before it is reported.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from oracle.candidate import Candidate
from oracle.extract import extract
from oracle.verdict import Verdict
from search.generators.base import Completion, SampleRequest
from search.pool import OraclePool
from search.store import RunStore
from strategies.base import Attempt, Strategy
from tasks.model import Task


@dataclass
class SearchPlan:
    n: int
    rounds: int = 1
    target_speedup: float = 1.0
    early_stop: bool = True
    seed: int = 0
    backend: str = "auto"  # how candidates are built ("auto": detect from the code)
    max_tokens: int = 4096
    temperature: float = 0.8


def sample_seed(run_seed: int, task_id: str, round: int, chain: int) -> int:
    digest = hashlib.sha256(f"{run_seed}:{task_id}:{round}:{chain}".encode()).hexdigest()
    return int(digest[:8], 16)


@dataclass
class TaskState:
    task: Task
    verdicts: dict[str, asyncio.Future] = field(default_factory=dict)  # candidate hash -> verdict JSON
    first_sample: dict[str, int] = field(default_factory=dict)  # hash -> sample number that brought it
    best: tuple[float, str, str] | None = None  # (time_ms, source, hash)
    stopped: bool = False
    stop_reason: str = ""
    requests: set[str] = field(default_factory=set)
    prepare_steps: list[dict[str, Any]] = field(default_factory=list)  # helper steps of Strategy.prepare


class StrategyTools:
    """The `strategies.base.Tools` the controller lends a strategy for one task, round and chain: the oracle
    pool's profile, and helper completions from the run's generator actor (recorded in `steps`)."""

    def __init__(self, controller: "Controller", state: TaskState, rnd: int, chain: int) -> None:
        self.controller, self.state, self.rnd, self.chain = controller, state, rnd, chain
        self.steps: list[dict[str, Any]] = []

    async def profile(self, task: Task) -> dict[str, Any]:
        try:
            return await self.controller.pool.profile(task)
        except Exception as exc:  # noqa: BLE001 - a strategy works without a profile
            return {"task": task.id, "error": f"profiling failed: {type(exc).__name__}: {exc}"[:500]}

    async def ask(self, messages: list[dict[str, str]], step: str = "helper", max_tokens: int | None = None) -> str:
        plan, task = self.controller.plan, self.state.task
        k = len(self.steps)
        seed = sample_seed(plan.seed, f"{task.id}#{step}{k}", self.rnd, self.chain)
        entry: dict[str, Any] = {"step": step, "seed": seed, "messages": messages, "completion": "", "tokens": 0, "error": None}
        self.steps.append(entry)
        if self.state.stopped:
            entry["error"] = "the task had stopped"
            return ""
        request = SampleRequest(
            request_id=f"{task.id}#{self.chain}#{self.rnd}#{step}{k}#{time.time_ns()}", task_id=task.id,
            messages=messages, seeds=[seed], samples=[max(0, self.rnd) * plan.n + max(0, self.chain)],
            max_tokens=min(plan.max_tokens, max_tokens or plan.max_tokens), temperature=plan.temperature)
        completion = None
        try:
            async for c in self.controller._stream(self.state, request):
                completion = c
        except Exception as exc:  # noqa: BLE001 - a failed helper call is a failed step, not a failed run
            entry["error"] = f"{type(exc).__name__}: {exc}"[:500]
            return ""
        if completion is None:
            entry["error"] = "aborted"
            return ""
        entry.update(completion=completion.text, tokens=completion.tokens, generation_s=completion.generation_s,
                     error=completion.error)
        return completion.text


class Controller:
    def __init__(self, plan: SearchPlan, strategy: Strategy, generator: Any, pool: OraclePool, store: RunStore,
                 on_record: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.plan = plan
        self.strategy = strategy
        self.generator = generator  # a GeneratorActor handle
        self.pool = pool
        self.store = store
        self.on_record = on_record or (lambda record: None)
        self.recorded = {(r["task"], r["round"], r["sample"]): r for r in store.samples()}
        self.oracle_slots = asyncio.Semaphore(pool.capacity)  # no more in flight than the oracles can work on
        # rounds of one chain build on each other; otherwise every sample starts afresh and is a chain of its own
        self.chained = not (strategy.shares_prompt(1) or plan.rounds == 1)

    # ------------------------------------------------------------ whole run

    async def run(self, tasks: list[Task]) -> None:
        config = self.store.config()
        options = {**config.get("strategy_options", {}), **self.strategy.options()}
        if options != config.get("strategy_options"):
            self.store.update_config(strategy_options=options)
        await asyncio.gather(*(self.run_task(t) for t in tasks))

    async def run_task(self, task: Task) -> None:
        state = TaskState(task)
        self._replay_recorded(state)
        plan = self.plan
        if not state.stopped and any((task.id, r, i) not in self.recorded for r in range(plan.rounds) for i in range(plan.n)):
            tools = StrategyTools(self, state, -1, -1)
            try:
                await self.strategy.prepare(task, tools)
            except Exception as exc:  # noqa: BLE001 - the strategy goes on without what it wanted to prepare
                tools.steps.append({"step": "prepare", "error": f"{type(exc).__name__}: {exc}"[:500]})
            state.prepare_steps = tools.steps
        if not self.chained:
            await self._independent_samples(state)
        else:
            await asyncio.gather(*(self._chain(state, i) for i in range(self.plan.n)))
        await self._report_best(state)

    def _replay_recorded(self, state: TaskState) -> None:
        """On resume, earlier samples count toward the stop rule, the best kernel and de-duplication."""
        for r in self.recorded.values():
            if r["task"] != state.task.id:
                continue
            if r.get("hash") and r["hash"] not in state.verdicts:
                fut = asyncio.get_running_loop().create_future()
                fut.set_result(r)
                state.verdicts[r["hash"]] = fut
            self._note_verdict(state, r)

    # ------------------------------------------------------------ zero-shot style: all samples from one prompt

    async def _independent_samples(self, state: TaskState) -> None:
        task, plan = state.task, self.plan
        slots = [(r, i) for r in range(plan.rounds) for i in range(plan.n) if (task.id, r, i) not in self.recorded]
        if not slots or state.stopped:
            return
        tools = StrategyTools(self, state, 0, 0)
        messages = await self.strategy.round_messages(task, 0, [], tools)
        steps = state.prepare_steps + tools.steps
        request = SampleRequest(
            request_id=f"{task.id}#{time.time_ns()}", task_id=task.id, messages=messages,
            seeds=[sample_seed(plan.seed, task.id, r, i) for r, i in slots],
            samples=[r * plan.n + i for r, i in slots], max_tokens=plan.max_tokens, temperature=plan.temperature,
        )
        judged: list[asyncio.Task] = []
        seen: set[int] = set()
        async for completion in self._stream(state, request):
            if completion.index < 0:  # the generator failed: every sample it did not deliver is recorded as failed
                for k, (r, i) in enumerate(slots):
                    if k not in seen and not state.stopped:
                        failed = Completion(request.request_id, k, request.seeds[k], "", error=completion.error)
                        self._record(state, r, i, failed.seed, messages, failed, None, None, agent_steps=steps)
                break
            seen.add(completion.index)
            r, i = slots[completion.index]
            judged.append(asyncio.create_task(self._judge_and_record(state, r, i, messages, completion, steps)))
        await asyncio.gather(*judged)

    # ------------------------------------------------------------ refinement style: n chains of rounds

    async def _chain(self, state: TaskState, chain: int) -> None:
        task, plan = state.task, self.plan
        history: list[Attempt] = [
            Attempt(r["round"], r["completion"], r["status"], r["message"], r.get("speedup_vs_eager"))
            for r in sorted((r for r in self.recorded.values() if r["task"] == task.id and r["sample"] == chain),
                            key=lambda r: r["round"])
        ]
        for rnd in range(plan.rounds):
            if state.stopped:
                return
            if (task.id, rnd, chain) in self.recorded:
                continue
            if history and history[-1].status == "correct" and (history[-1].speedup_vs_eager or 0) >= plan.target_speedup:
                return  # this chain is done: correct and fast enough
            tools = StrategyTools(self, state, rnd, chain)
            messages = await self.strategy.round_messages(task, rnd, history, tools)
            steps = (state.prepare_steps if rnd == 0 else []) + tools.steps
            if state.stopped:
                return
            seed = sample_seed(plan.seed, task.id, rnd, chain)
            request = SampleRequest(request_id=f"{task.id}#{chain}#{rnd}#{time.time_ns()}", task_id=task.id,
                                    messages=messages, seeds=[seed], samples=[rnd * plan.n + chain],
                                    max_tokens=plan.max_tokens, temperature=plan.temperature)
            completion = None
            async for c in self._stream(state, request):
                completion = c
            if completion is None:  # aborted because the task stopped
                return
            record = await self._judge_and_record(state, rnd, chain, messages, completion, steps)
            history.append(Attempt(rnd, completion.text, record["status"], record["message"], record.get("speedup_vs_eager")))

    # ------------------------------------------------------------ shared steps

    async def _stream(self, state: TaskState, request: SampleRequest):
        await self.generator.start.remote(request)
        state.requests.add(request.request_id)
        try:
            while True:
                completion: Completion | None = await self.generator.next.remote(request.request_id)
                if completion is None:
                    return
                if completion.error and completion.index >= 0:
                    completion.text = ""
                yield completion
        finally:
            state.requests.discard(request.request_id)

    async def _judge_and_record(self, state: TaskState, rnd: int, chain: int, messages, completion: Completion,
                                agent_steps: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        task = state.task
        if state.stopped:
            return self._record(state, rnd, chain, completion.seed, messages, completion, None, "cancelled",
                                agent_steps=agent_steps)
        found = extract(completion.text, self.plan.backend)
        if found.source is None:
            verdict = Verdict(task.id, "no_code", completion.error or found.reason)
            return self._record(state, rnd, chain, completion.seed, messages, completion, verdict.to_json(), None,
                                agent_steps=agent_steps)
        candidate = Candidate.make(task.id, found.source, found.backend or "torch")
        data = None
        if candidate.hash not in state.verdicts:
            # Queued work waits here, in the driver, for a free oracle slot: a task that stops meanwhile drops it.
            async with self.oracle_slots:
                if state.stopped:
                    return self._record(state, rnd, chain, completion.seed, messages, completion, None, "cancelled",
                                        agent_steps=agent_steps)
                if candidate.hash not in state.verdicts:
                    data = await self._evaluate_new(state, candidate, rnd * self.plan.n + chain)
        duplicate_of = None
        if data is None:
            duplicate_of = state.first_sample.get(candidate.hash)
            data = await state.verdicts[candidate.hash]
        record = self._record(state, rnd, chain, completion.seed, messages, completion, data, None,
                              duplicate_of=duplicate_of, source=candidate.source, agent_steps=agent_steps)
        return record

    async def _evaluate_new(self, state: TaskState, candidate: Candidate, sample_number: int) -> dict[str, Any]:
        """Judge a candidate not seen before in this task; later samples with its hash await the same verdict."""
        fut = asyncio.get_running_loop().create_future()
        state.verdicts[candidate.hash] = fut
        state.first_sample[candidate.hash] = sample_number
        try:
            data = (await self.pool.evaluate(state.task, candidate)).to_json()
        except BaseException:
            del state.verdicts[candidate.hash]
            fut.cancel()
            raise
        fut.set_result(data)
        return data

    def _record(self, state: TaskState, rnd: int, chain: int, seed: int, messages, completion: Completion,
                verdict: dict[str, Any] | None, cancelled: str | None, duplicate_of: int | None = None,
                source: str | None = None, agent_steps: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        v = verdict or {"status": "no_code", "message": f"generation failed: {completion.error}"}
        status = v["status"]
        record = {
            "task": state.task.id, "strategy": self.strategy.name, "round": rnd, "sample": chain,
            "sample_number": rnd * self.plan.n + chain, "chain": chain if self.chained else rnd * self.plan.n + chain,
            "seed": seed,
            "status": "cancelled" if cancelled else status,
            "message": "the task had stopped before this sample was judged" if cancelled else v.get("message", ""),
            "hash": v.get("hash"), "backend": v.get("backend"), "duplicate_of": duplicate_of,
            "time_ms": v.get("time_ms"), "eager_ms": v.get("eager_ms"), "compile_ms": v.get("compile_ms"),
            "speedup_vs_eager": v.get("speedup_vs_eager"), "speedup_vs_compile": v.get("speedup_vs_compile"),
            "build_s": 0.0 if duplicate_of is not None else v.get("build_s"),
            "verify_s": None if duplicate_of is not None else v.get("verify_s"),
            "time_s": None if duplicate_of is not None else v.get("time_s"),
            "device_s": None if duplicate_of is not None else v.get("device_s"),
            "timing": v.get("timing") or {},
            "flags": v.get("flags", []), "node": v.get("node"), "sizes": dict(state.task.sizes),
            "tokens": completion.tokens, "prompt_tokens": completion.prompt_tokens, "finish_reason": completion.finish_reason,
            "generation_s": completion.generation_s,
            "completion": completion.text, "messages": messages, "agent_steps": list(agent_steps or []),
            "recorded_at": time.time(),
        }
        if completion.replica is not None:  # which generator replica wrote it (--generator-replicas)
            record["replica"] = completion.replica
        if cancelled and not completion.text:
            return record  # nothing generated: a cancelled slot is not a sample
        self.store.append(record)
        self.recorded[(state.task.id, rnd, chain)] = record
        self._note_verdict(state, record, source)
        self.on_record(record)
        return record

    def _note_verdict(self, state: TaskState, record: dict[str, Any], source: str | None = None) -> None:
        if record.get("status") != "correct" or record.get("time_ms") is None:
            return
        if source is None:
            found = extract(record.get("completion", ""), self.plan.backend)
            source = found.source or ""
        if state.best is None or record["time_ms"] < state.best[0]:
            state.best = (record["time_ms"], source, record.get("hash") or "")
        if self.plan.early_stop and (record.get("speedup_vs_eager") or 0) >= self.plan.target_speedup and not state.stopped:
            state.stopped = True
            state.stop_reason = f"a correct kernel reached {record['speedup_vs_eager']:.2f}x eager"
            for request_id in list(state.requests):
                asyncio.get_running_loop().create_task(self.generator.abort.remote(request_id))

    async def _report_best(self, state: TaskState) -> None:
        """Re-time the task's best kernel in a fresh process and write it to best/."""
        if state.best is None or not state.best[1] or self.store.best(state.task.id):
            return
        _, source, _ = state.best
        found = extract(source, self.plan.backend)
        candidate = Candidate.make(state.task.id, source, found.backend or "torch")
        verdict = await self.pool.evaluate(state.task, candidate, retime=True)
        data = verdict.to_json()
        data["retimed"] = True
        data["stop_reason"] = state.stop_reason
        self.store.write_best(state.task.id, source, data)
