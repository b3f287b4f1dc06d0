"""The search controller: spreads n samples and refinement rounds over the generator and the oracle pool.

Per task it asks the strategy for messages, streams completions from the generator (a `GeneratorClient`),
turns each into a candidate (`oracle.extract.candidate_from_completion`), de-duplicates candidates by content
hash, sends new ones to the oracle pool as they arrive, records every sample in the run store as a
`SampleRecord`, and applies the `StopRule`: a task stops when a verified-correct kernel reaches the target
speedup (or its budget is spent), cancelling its outstanding work. The best kernel is re-timed in a fresh
process before it is reported, when its one timing could be biased: it was the fastest of several correct
kernels, or its eager baseline was not timed in this run (`timing_stands`).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from oracle.candidate import Candidate
from oracle.extract import candidate_from_completion, no_code_verdict
from oracle.verdict import Verdict
from search.generators.base import Completion, SampleRequest
from search.pool import OraclePool
from search.stop import StopRule
from search.store import CompileBaseline, RunStore, SampleRecord, with_baseline
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

    @property
    def stop_rule(self) -> StopRule:
        return StopRule(self.target_speedup, self.early_stop)


def sample_seed(run_seed: int, task_id: str, round: int, chain: int) -> int:
    digest = hashlib.sha256(f"{run_seed}:{task_id}:{round}:{chain}".encode()).hexdigest()
    return int(digest[:8], 16)


@dataclass
class TaskState:
    task: Task
    verdicts: dict[str, asyncio.Future] = field(default_factory=dict)  # candidate hash -> its Verdict
    first_sample: dict[str, int] = field(default_factory=dict)  # hash -> index of the sample that brought it
    best: SampleRecord | None = None  # the fastest correct sample (with its candidate)
    correct: set[str] = field(default_factory=set)  # hashes of the task's distinct correct kernels
    stopped: bool = False
    stop_reason: str = ""
    requests: set[str] = field(default_factory=set)
    prepare_steps: list[dict[str, Any]] = field(default_factory=list)  # helper steps of Strategy.prepare
    baseline: CompileBaseline | None = None  # the task's torch.compile baseline, once recorded


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
            async for c in self.controller.stream(self.state, request):
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
                 on_record: Callable[[SampleRecord], None] | None = None, device: str = "cpu") -> None:
        self.plan = plan
        self.stop = plan.stop_rule
        self.strategy = strategy
        self.generator = generator  # a GeneratorClient (async `sample` and `abort`)
        self.pool = pool
        self.store = store
        self.device = device  # the oracles' device, which verdicts made here (no code) name too
        self.on_record = on_record or (lambda record: None)
        self.recorded: dict[tuple[str, int], SampleRecord] = {r.key: r for r in store.samples()}  # by slot
        self.baselines = store.baselines()  # by task, on resume
        self.started = time.time()  # eager baselines timed since are this run's own (`timing_stands`)
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
        if not state.stopped and any((task.id, i) not in self.recorded for i in range(plan.rounds * plan.n)):
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
        state.baseline = self.baselines.get(state.task.id)
        for r in sorted((r for r in self.recorded.values() if r.task == state.task.id), key=lambda r: r.sample_index):
            if r.hash and r.verdict is not None and r.hash not in state.verdicts:
                fut = asyncio.get_running_loop().create_future()
                fut.set_result(r.verdict)
                state.verdicts[r.hash] = fut
                state.first_sample[r.hash] = r.duplicate_of if r.duplicate_of is not None else r.sample_index
            self._note_verdict(state, r)

    # ------------------------------------------------------------ zero-shot style: all samples from one prompt

    async def _independent_samples(self, state: TaskState) -> None:
        task, plan = state.task, self.plan
        slots = [(r, i) for r in range(plan.rounds) for i in range(plan.n) if (task.id, r * plan.n + i) not in self.recorded]
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
        async for completion in self.stream(state, request):
            r, i = slots[completion.index]
            judged.append(asyncio.create_task(self._judge_and_record(state, r, i, messages, completion, steps)))
        await asyncio.gather(*judged)

    # ------------------------------------------------------------ refinement style: n chains of rounds

    async def _chain(self, state: TaskState, chain: int) -> None:
        task, plan = state.task, self.plan
        history: list[Attempt] = [
            r.attempt() for r in sorted((r for r in self.recorded.values()
                                         if r.task == task.id and r.sample_index % plan.n == chain), key=lambda r: r.round)
        ]
        for rnd in range(plan.rounds):
            if state.stopped:
                return
            if (task.id, rnd * plan.n + chain) in self.recorded:
                continue
            if history and self.stop.ends_chain(history[-1].status, history[-1].speedup_vs_eager):
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
            async for c in self.stream(state, request):
                completion = c
            if completion is None:  # aborted because the task stopped
                return
            record = await self._judge_and_record(state, rnd, chain, messages, completion, steps)
            history.append(record.attempt())

    # ------------------------------------------------------------ shared steps

    async def stream(self, state: TaskState, request: SampleRequest):
        """The request's completions from the generator, each as it finishes; the task's stop aborts them."""
        state.requests.add(request.request_id)
        try:
            async for completion in self.generator.sample(request):
                if completion.error:
                    completion.text = ""
                yield completion
        finally:
            state.requests.discard(request.request_id)

    async def _judge_and_record(self, state: TaskState, rnd: int, chain: int, messages, completion: Completion,
                                agent_steps: list[dict[str, Any]] | None = None) -> SampleRecord:
        task = state.task
        record = lambda verdict, candidate=None, duplicate_of=None: self._record(  # noqa: E731
            state, rnd, chain, messages, completion, verdict, candidate, duplicate_of, agent_steps)
        if state.stopped:
            return record(None)
        if completion.error:
            return record(no_code_verdict(task, f"generation failed: {completion.error}", self.device))
        found = candidate_from_completion(task, completion.text, self.plan.backend, self.device)
        if isinstance(found, Verdict):
            return record(found)
        candidate = found
        verdict = None
        if candidate.hash not in state.verdicts:
            # Queued work waits here, in the driver, for a free oracle slot: a task that stops meanwhile drops it.
            async with self.oracle_slots:
                if state.stopped:
                    return record(None, candidate)
                if candidate.hash not in state.verdicts:
                    verdict = await self._evaluate_new(state, candidate, rnd * self.plan.n + chain)
                    if verdict.correct and verdict.time_ms is not None:  # before another candidate takes the slot
                        self._stop_if_fast(state, verdict.speedup_vs_eager)
            if verdict is not None:
                # Recorded as judged; out of the slot, it then waits for its task's torch.compile baseline,
                # holding none (the baseline can take minutes: a run cut meanwhile keeps the verdict).
                state.verdicts[candidate.hash].set_result(verdict)
                return await self._with_compile_baseline(state, record(verdict, candidate))
        duplicate_of = None
        if verdict is None:
            duplicate_of = state.first_sample.get(candidate.hash)
            verdict = await state.verdicts[candidate.hash]
        return record(verdict, candidate, duplicate_of)

    async def _evaluate_new(self, state: TaskState, candidate: Candidate, sample_index: int) -> Verdict:
        """Judge a candidate not seen before in this task; later samples with its hash await the same verdict
        (the caller sets it, as soon as it is judged)."""
        state.verdicts[candidate.hash] = asyncio.get_running_loop().create_future()
        state.first_sample[candidate.hash] = sample_index
        try:
            return await self.pool.evaluate(state.task, candidate)
        except BaseException:
            state.verdicts.pop(candidate.hash).cancel()
            raise

    async def _with_compile_baseline(self, state: TaskState, record: SampleRecord) -> SampleRecord:
        """A correct sample, once its task's torch.compile baseline is measured: the baseline is recorded
        (once a task), and every correct sample of the task recorded without it gets it here and in the
        reader (`search.store.read_samples`). The record as it stands then."""
        verdict = record.verdict
        if verdict is None or not verdict.correct or state.baseline is not None:
            return self.recorded.get(record.key, record)
        baseline = CompileBaseline.of(await self.pool.with_compile_baseline(state.task, verdict), time.time())
        if baseline is None:  # this run measures no compile baseline (on a CPU by default)
            return record
        if state.baseline is None:  # another sample of the task may have brought it meanwhile
            state.baseline = baseline
            self.store.append_baseline(baseline)
            for key, r in list(self.recorded.items()):
                if r.task == state.task.id and (updated := with_baseline(r, baseline)) is not r:
                    self.recorded[key] = updated
                    self.on_record(updated)
        return self.recorded.get(record.key, record)

    def _record(self, state: TaskState, rnd: int, chain: int, messages, completion: Completion,
                verdict: Verdict | None, candidate: Candidate | None, duplicate_of: int | None,
                agent_steps: list[dict[str, Any]] | None) -> SampleRecord:
        """Record one sample (`verdict` None: cancelled, its task stopped before it was judged)."""
        index = rnd * self.plan.n + chain
        record = SampleRecord(
            task=state.task.id, strategy=self.strategy.name, round=rnd, chain=chain if self.chained else index,
            sample_index=index, seed=completion.seed,
            status=verdict.status if verdict is not None else "cancelled", verdict=verdict, candidate=candidate,
            duplicate_of=duplicate_of, completion=completion.text, tokens_in=completion.prompt_tokens,
            tokens_out=completion.tokens, generation_s=completion.generation_s,
            finish_reason=completion.finish_reason, replica=completion.replica, node=getattr(verdict, "node", None),
            oracle_device_s=verdict.candidate_device_s if verdict is not None and duplicate_of is None else 0.0,
            messages=messages, agent_steps=list(agent_steps or []), recorded_at=time.time())
        record = with_baseline(record, state.baseline)  # a correct sample judged after its task's baseline
        if verdict is None and not completion.text:
            return record  # nothing generated: a cancelled slot is not a sample
        self.store.append(record)
        self.recorded[record.key] = record
        self._note_verdict(state, record)
        self.on_record(record)
        return record

    def _note_verdict(self, state: TaskState, record: SampleRecord) -> None:
        if not record.correct or record.time_ms is None:
            return
        if record.hash:
            state.correct.add(record.hash)
        if record.candidate is not None and (state.best is None or record.time_ms < state.best.time_ms):
            state.best = record
        self._stop_if_fast(state, record.speedup_vs_eager)

    def _stop_if_fast(self, state: TaskState, speedup_vs_eager: float | None) -> None:
        """Early stop: a correct kernel reached the plan's speedup; the task's queued and ungenerated samples go."""
        if self.stop.stops_task("correct", speedup_vs_eager) and not state.stopped:
            state.stopped = True
            state.stop_reason = f"a correct kernel reached {speedup_vs_eager:.2f}x eager"
            for request_id in list(state.requests):
                asyncio.get_running_loop().create_task(self.generator.abort(request_id))

    async def _report_best(self, state: TaskState) -> None:
        """Write the task's best kernel to best/, re-timed in a fresh process unless its own timing stands."""
        if state.best is None or self.store.best(state.task.id):
            return
        record = self.recorded.get(state.best.key, state.best)  # with its task's torch.compile baseline, once recorded
        candidate = record.candidate
        if record.verdict is not None and timing_stands(len(state.correct), record.verdict, self.started):
            data = record.verdict.to_json()
            data["retimed"] = False
            data["not_retimed"] = NOT_RETIMED
        else:
            verdict = await self.pool.evaluate(state.task, candidate, retime=True)
            data = verdict.to_json()
            data["retimed"] = True
            data["retimed_at"] = time.time()  # when the run had it: a run's tail is its re-timings
        data["stop_reason"] = state.stop_reason
        self.store.write_best(state.task.id, candidate.source, data)


NOT_RETIMED = "the task's only correct kernel, timed beside an eager baseline timed in this run"


def timing_stands(correct_kernels: int, verdict: Verdict, run_started: float) -> bool:
    """Whether a best kernel's own verdict is as good as a re-timing (docs/oracle.md, rule 18). A re-timing
    corrects two biases: the fastest single timing among several correct kernels is biased low (the noise
    that made it fastest), and a baseline read from the disk cache was timed under other conditions. A task's
    only correct kernel, timed against eager timed in this run, has neither: re-timing it would only spend
    the device's time (on a corpus of one correct kernel a task, the whole tail of a run)."""
    measured = verdict.eager_measured_at
    return correct_kernels == 1 and measured is not None and measured >= run_started
