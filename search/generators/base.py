"""The one small interface every generator implements: sample n completions for messages; abort.

A generator streams each completion as soon as it is finished (the oracle can start on sample 1 while
sample 8 is still being written). Each sample has its own seed, so a run can be repeated sample by sample.
Generators run inside a Ray actor (`search.generators.actor`), never in the driver, which reaches them through
`search.generators.client.GeneratorClient`.
"""

from __future__ import annotations

import abc
import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class SampleRequest:
    request_id: str  # unique per request; `abort` takes it
    task_id: str
    messages: list[dict[str, str]]  # chat messages: {"role": "system"|"user"|"assistant", "content": ...}
    seeds: list[int]  # one per sample: len(seeds) is n
    samples: list[int] = field(default_factory=list)  # the task-wide sample numbers these are (replay uses them)
    max_tokens: int = 4096
    temperature: float = 0.8
    top_p: float = 0.95

    @property
    def n(self) -> int:
        return len(self.seeds)


@dataclass
class Completion:
    request_id: str
    index: int  # position within the request, 0..n-1
    seed: int
    text: str
    tokens: int = 0  # generated tokens
    prompt_tokens: int = 0
    finish_reason: str | None = None  # "stop", "length", "abort", ...
    error: str | None = None  # the generator failed for this sample (the text is then empty)
    replica: int | None = None  # which generator replica wrote it (set by `GeneratorClient`)
    generation_s: float | None = None  # seconds from the request's start until this sample was finished (`timed`)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class GeneratorError(Exception):
    """The generator cannot be used (bad spec, server unreachable, model missing): one line for the user."""


class Generator(abc.ABC):
    """Produces completions. Implementations must be safe to call from several asyncio tasks at once."""

    @abc.abstractmethod
    def sample(self, request: SampleRequest) -> AsyncIterator[Completion]:
        """Yield the request's n completions, each as soon as it is finished (any order)."""

    @abc.abstractmethod
    async def abort(self, request_id: str) -> None:
        """Stop a request's outstanding samples; its stream ends soon after. Unknown ids are ignored."""

    async def pause(self) -> None:
        """Hold generation until `resume` (an oracle on the same GPU is timing): running samples freeze and
        keep their progress. Returns once nothing is computing. The default cannot pause (a remote server)."""

    async def resume(self) -> None:
        """Continue after `pause`."""

    def describe(self) -> dict[str, Any]:
        """What to record in a run's config.json to repeat the run."""
        return {"kind": type(self).__name__}

    async def close(self) -> None:
        """Release the engine, connections and memory."""


async def timed(stream: AsyncIterator[Completion]) -> AsyncIterator[Completion]:
    """The stream with `generation_s` set on each completion that lacks it: the seconds from the start of
    the request until the completion came out. The samples of one request start together, so this is each
    sample's own latency (time paused for an oracle's timing included); several sequences decoding at once
    share those seconds, which is why a budget in generated tokens is the one to read under heavy batching."""
    t0 = time.perf_counter()
    async for completion in stream:
        if completion.generation_s is None and completion.index >= 0:
            completion.generation_s = time.perf_counter() - t0
        yield completion


async def as_finished(tasks: list[asyncio.Task]) -> AsyncIterator[Any]:
    """Yield each task's result (None results skipped) as soon as it finishes, in finishing order.

    Closing the stream early (an abort, or a consumer that stops) cancels the tasks still running, which is
    how a generator's outstanding samples are stopped. Use it with `contextlib.aclosing`.
    """
    pending = set(tasks)
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if not task.cancelled() and (result := task.result()) is not None:
                    yield result
    finally:
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
