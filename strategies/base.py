"""A strategy turns a task and the history of one chain's verdicts into the chat messages for a round."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

from tasks.model import Task


@dataclass
class Attempt:
    """One earlier round of a chain: what the model wrote and what the oracle said."""

    round: int
    completion: str
    status: str
    message: str
    speedup_vs_eager: float | None = None


class Strategy(abc.ABC):
    name: str = ""
    summary: str = ""

    def __init__(self, backend: str = "cuda") -> None:
        self.backend = backend

    @abc.abstractmethod
    def messages(self, task: Task, round: int, history: list[Attempt]) -> list[dict[str, str]]:
        """Chat messages for `round` (0-based) of one chain, given that chain's earlier attempts."""

    def shares_prompt(self, round: int) -> bool:
        """True when every chain gets the same messages in this round (one request can sample all n)."""
        return round == 0

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "backend": self.backend}
