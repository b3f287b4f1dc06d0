"""Zero-shot: the task, the backend's rules and one worked example; every sample starts afresh."""

from __future__ import annotations

from strategies.base import Attempt, Strategy
from strategies.prompts import RULES, SYSTEM, example_block, task_block
from tasks.model import Task


class ZeroShot(Strategy):
    name = "zero-shot"
    summary = "the task, the backend's rules and one worked example; rounds are fresh samples"

    def messages(self, task: Task, round: int, history: list[Attempt]) -> list[dict[str, str]]:
        user = "\n\n".join([
            RULES[self.backend],
            example_block(self.backend),
            f"Now the task. Replace the operators of this `Model` with custom kernels:\n{task_block(task.code)}",
            "Answer with the complete module defining ModelNew in one ```python block.",
        ])
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]

    def shares_prompt(self, round: int) -> bool:
        return True
