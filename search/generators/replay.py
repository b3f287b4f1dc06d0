"""Replay: completions recorded earlier (a run's samples.jsonl, or any JSONL with `task` and `completion`).

How a large-n study is re-evaluated on new hardware or a new oracle without generating again. A recorded
completion keeps its cost: `tokens`, `prompt_tokens` and `generation_s` are passed on when the line has them.
Sample i of a task draws that task's completions without replacement, in an order fixed by the seed, wrapping
around when n exceeds them.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
import time
from pathlib import Path
from typing import Any

from search.generators.base import Completion, Generator, GeneratorError, SampleRequest


def _count(x: Any) -> int:
    return int(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0 else 0


def _seconds(x: Any, default: float) -> float:
    """A recorded completion's generation seconds (it stands in for the model, cost included), else the
    replay's own delay."""
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0 else default


class ReplayGenerator(Generator):
    def __init__(self, path: str | Path, seed: int = 0, delay_s: float = 0.0) -> None:
        self.path = Path(path)
        self.seed = seed
        self.delay_s = delay_s  # "generation" time per sample (tests of pausing and spreading)
        self._running = asyncio.Event()
        self._running.set()
        self.emitted: list[float] = []  # when each completion was handed out (time.time())
        self.by_task: dict[str, list[dict[str, Any]]] = {}
        if not self.path.is_file():
            raise GeneratorError(f"replay file {self.path} does not exist")
        for n, line in enumerate(self.path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line of an interrupted run
            if isinstance(row, dict) and isinstance(row.get("task"), str) and isinstance(row.get("completion"), str):
                self.by_task.setdefault(row["task"], []).append(row)
        if not self.by_task:
            raise GeneratorError(f"replay file {self.path} has no lines with `task` and `completion`")
        self._aborted: set[str] = set()

    def order(self, task_id: str) -> list[int]:
        """The seeded order in which a task's completions are drawn."""
        rows = self.by_task.get(task_id, [])
        order = list(range(len(rows)))
        random.Random(f"{self.seed}:{task_id}").shuffle(order)
        return order

    async def sample(self, request: SampleRequest) -> AsyncIterator[Completion]:
        rows = self.by_task.get(request.task_id, [])
        order = self.order(request.task_id)
        numbers = request.samples or list(range(request.n))
        for index, (number, seed) in enumerate(zip(numbers, request.seeds)):
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            await self._running.wait()  # paused: nothing comes out until resumed
            if request.request_id in self._aborted:
                return
            self.emitted.append(time.time())
            if not rows:
                yield Completion(request.request_id, index, seed, "", error=f"no recorded completions for {request.task_id}")
                continue
            row = rows[order[number % len(rows)]]
            yield Completion(request.request_id, index, seed, row["completion"], tokens=_count(row.get("tokens")),
                             prompt_tokens=_count(row.get("prompt_tokens")), finish_reason="replay",
                             generation_s=_seconds(row.get("generation_s"), self.delay_s))

    async def abort(self, request_id: str) -> None:
        self._aborted.add(request_id)

    async def pause(self) -> None:
        self._running.clear()

    async def resume(self) -> None:
        self._running.set()

    def describe(self) -> dict[str, Any]:
        return {"kind": "replay", "path": str(self.path.resolve()), "seed": self.seed,
                "tasks": len(self.by_task), "completions": sum(map(len, self.by_task.values()))}
