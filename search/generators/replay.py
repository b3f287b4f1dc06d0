"""Replay: completions recorded earlier (a run's samples.jsonl, or any JSONL with `task` and `completion`).

How a large-n study is re-evaluated on new hardware or a new oracle without generating again. A recorded
completion keeps its cost: its generated and prompt tokens (`tokens_out` and `tokens_in` as a run's records
name them, or `tokens` and `prompt_tokens`) and `generation_s` are passed on when the line has them. Sample i
of a task draws that task's completions without replacement, in an order fixed by the seed, wrapping around
when n exceeds them.

`read_replay` is the file's one reader: the command line calls it before it starts anything (to report bad
lines and to learn which tasks the file names), and the generator in its actor reads the file with it again.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from search.generators.base import Completion, Generator, GeneratorError, SampleRequest
from search.store import read_jsonl


@dataclass
class ReplayFile:
    """The completions of a replay file by task, in file order, and the lines that were skipped."""

    path: Path
    by_task: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # one line each: which line and why

    @property
    def tasks(self) -> list[str]:
        return list(self.by_task)


def read_replay(path: str | Path) -> ReplayFile:
    """Every usable line of a replay file; a line that is not a JSON object with `task` and `completion` text
    is skipped and named in `skipped`. GeneratorError when the file is missing or has no usable line."""
    found = ReplayFile(Path(path))
    if not found.path.is_file():
        raise GeneratorError(f"replay file {found.path} does not exist")
    try:
        lines = read_jsonl(found.path)
    except (OSError, UnicodeDecodeError) as exc:
        raise GeneratorError(f"cannot read replay file {found.path} ({exc.__class__.__name__})") from None
    rows, bad = list(lines.rows), list(lines.bad)
    if lines.tail is not None:  # a hand-written file may end without a newline; a run's may end in a torn line
        number, text = lines.tail
        try:
            rows.append((number, json.loads(text)))
        except json.JSONDecodeError:
            bad.append((number, "is cut off (no newline at its end, and not JSON)"))
    for number, row in rows:
        if isinstance(row, dict) and isinstance(row.get("task"), str) and isinstance(row.get("completion"), str):
            found.by_task.setdefault(row["task"], []).append(row)
        else:
            bad.append((number, "has no `task` and `completion` text"))
    found.skipped = [f"line {number} {why}, skipped" for number, why in sorted(bad)]
    if not found.by_task:
        raise GeneratorError(f"replay file {found.path} has no lines with `task` and `completion`")
    return found


def _first(row: dict[str, Any], *keys: str) -> Any:
    """The value of the first key the row has (a run's records and hand-written files name costs differently)."""
    return next((row[k] for k in keys if k in row), None)


def _count(x: Any) -> int:
    return int(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0 else 0


def _seconds(x: Any, default: float) -> float:
    """A recorded completion's generation seconds (it stands in for the model, cost included), else the
    replay's own delay."""
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0 else default


class ReplayGenerator(Generator):
    def __init__(self, path: str | Path, seed: int = 0, delay_s: float = 0.0, load_s: float = 0.0) -> None:
        self.path = Path(path)
        self.seed = seed
        self.delay_s = delay_s  # "generation" time per sample (tests of pausing and spreading)
        if load_s:  # a start as slow as a model's load (tests of what overlaps it)
            time.sleep(load_s)
        self._running = asyncio.Event()
        self._running.set()
        self.emitted: list[float] = []  # when each completion was handed out (time.time())
        self.by_task: dict[str, list[dict[str, Any]]] = read_replay(self.path).by_task
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
            yield Completion(request.request_id, index, seed, row["completion"],
                             tokens=_count(_first(row, "tokens_out", "tokens")),
                             prompt_tokens=_count(_first(row, "tokens_in", "prompt_tokens")), finish_reason="replay",
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
