"""A strategy turns a task and the history of one chain's verdicts into the chat messages for a round."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, Protocol

from tasks.model import Task


@dataclass
class Attempt:
    """One earlier round of a chain: what the model wrote, the module the oracle judged, what it said."""

    round: int
    completion: str
    status: str
    message: str
    speedup_vs_eager: float | None = None
    source: str | None = None  # the candidate module taken from the completion; None: there was none


class Tools(Protocol):
    """What the controller lends a strategy beyond the task and the history (see `search.controller`).

    `profile` is the oracle pool's profile of the task's reference (`oracle.profile`; `{"error": ...}` when
    it failed). `ask` is one helper completion from the run's generator (an agent's analysis or triage):
    the text, or "" when generation failed; the controller records its prompt and completion in `steps`,
    which go into the sample record as `agent_steps` (a strategy may add fields to a step, e.g. `ok`)."""

    steps: list[dict[str, Any]]
    chain: int  # the chain these tools serve (-1 in `prepare`)
    rnd: int  # the round (-1 in `prepare`)

    async def profile(self, task: Task) -> dict[str, Any]: ...

    async def ask(self, messages: list[dict[str, str]], step: str = "helper", max_tokens: int | None = None) -> str: ...


class Strategy(abc.ABC):
    name: str = ""
    summary: str = ""

    def __init__(self, backend: str = "cuda") -> None:
        self.backend = backend

    async def prepare(self, task: Task, tools: Tools) -> None:
        """Called by the controller once per task before round 0 (e.g. to profile the reference)."""

    async def round_messages(self, task: Task, round: int, history: list[Attempt], tools: Tools) -> list[dict[str, str]]:
        """The messages for a round, when a strategy needs the tools to make them (helper completions);
        the controller calls this. By default: `messages`."""
        return self.messages(task, round, history)

    @abc.abstractmethod
    def messages(self, task: Task, round: int, history: list[Attempt]) -> list[dict[str, str]]:
        """Chat messages for `round` (0-based) of one chain, given that chain's earlier attempts."""

    def shares_prompt(self, round: int) -> bool:
        """True when every chain gets the same messages in this round (one request can sample all n)."""
        return round == 0

    def options(self) -> dict[str, Any]:
        """The strategy's options as `make_strategy` takes them (recorded in config.json)."""
        return {"backend": self.backend}

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, **self.options()}
