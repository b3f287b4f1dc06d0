"""Iterative refinement: each chain continues from its own last candidate with the oracle's feedback.

Round 0 is the zero-shot prompt. Round r > 0 replays the conversation's last turn: the model's previous
answer (its code), then the oracle's verdict (status and message: compiler errors, mismatches, exceptions,
speed) and what to do about it: fix it, or, when it is correct but not fast enough, make it faster. The
controller ends a chain once it is correct and fast enough, or out of rounds.
"""

from __future__ import annotations

from oracle.verdict import ratio_text
from strategies.base import Attempt, Strategy
from strategies.prompts import task_block
from strategies.zero_shot import ZeroShot
from tasks.model import Task

MAX_CODE_CHARS = 16000  # a runaway answer is cut in the next prompt, not carried whole
MAX_MESSAGE_CHARS = 3000

ADVICE = {
    "correct": "It is correct but not fast enough yet. Make it faster while keeping it correct: fuse more of the work "
               "into fewer passes over memory, vectorise loads and stores, and avoid extra allocations and copies.",
    "incorrect": "Its outputs do not match the reference. Find the bug (indexing, bounds, the formula, broadcasting, "
                 "dtype) and fix it.",
    "compile_error": "It does not compile. Fix the compiler errors.",
    "runtime_error": "It failed when it ran. Fix the cause (bad indexing or launch configuration, a wrong signature, "
                     "a missing contiguous(), an exception in forward).",
    "timeout": "It did not finish in time (an infinite loop, a deadlock, or far too slow). Fix it.",
    "rejected": "The oracle rejected it. Follow the rules above and fix what the message names.",
    "no_code": "The answer had no usable code. Answer with the complete module in one ```python block.",
}


def previous_code(attempt: Attempt) -> str:
    """The code of an earlier answer as the next prompt shows it: the module the oracle judged, else the raw
    text (cut)."""
    text = attempt.source if attempt.source is not None else (attempt.completion or "")
    if len(text) > MAX_CODE_CHARS:
        text = text[:MAX_CODE_CHARS] + "\n# ... (cut)"
    return text


def feedback(attempt: Attempt, extra: str = "") -> str:
    """The oracle's verdict on an attempt, and what to do about it (`extra`: more advice, before the ask)."""
    message = (attempt.message or "").strip()
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS] + " ... (cut)"
    speed = ""
    if attempt.status == "correct" and attempt.speedup_vs_eager is not None:
        speed = f"\nSpeed: {ratio_text(attempt.speedup_vs_eager)}x eager PyTorch."
    advice = ADVICE.get(attempt.status, "Fix it.")
    extra = f"\n\n{extra.strip()}" if extra.strip() else ""
    return (f"The oracle compiled, checked and timed your last answer (round {attempt.round}).\n"
            f"Verdict: {attempt.status}\nMessage:\n{message or '(none)'}{speed}\n\n{advice}{extra}\n\n"
            "Answer with the complete corrected module defining ModelNew in one ```python block.")


class Refine(Strategy):
    name = "refine"
    summary = "each of n chains revises its own last kernel with the oracle's verdict (errors, mismatches, speed)"

    def __init__(self, backend: str = "cuda") -> None:
        super().__init__(backend)
        self.first = ZeroShot(backend)

    def messages(self, task: Task, round: int, history: list[Attempt]) -> list[dict[str, str]]:
        opening = self.first.messages(task, 0, [])
        if round == 0 or not history:
            return opening
        last = history[-1]
        code = previous_code(last)
        answer = task_block(code) if code.strip() else "(an empty answer)"
        return opening + [
            {"role": "assistant", "content": answer},
            {"role": "user", "content": feedback(last)},
        ]

    def shares_prompt(self, round: int) -> bool:
        return round == 0


__all__ = ["Refine", "feedback", "previous_code"]
