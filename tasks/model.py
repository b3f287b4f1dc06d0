"""The `Task` record: one problem whose PyTorch operators a candidate kernel must replace.

A task is KernelBench-shaped source code: a `Model(nn.Module)`, module-level integer size constants,
`get_inputs()` and `get_init_inputs()`. The record keeps the code already fitted to a memory budget
(see `tasks.fitting`), so every consumer - prompt, oracle, run store - sees the same sizes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Task:
    id: str  # "level1/19_ReLU" for KernelBench, "builtin/1_LeakyReLU_Scale" for ours
    level: int | None
    problem_id: int | None
    name: str
    code: str  # the source as fitted: size constants rewritten to `sizes`
    origin: str  # where it was loaded from (a file path, or "file.jsonl:line")
    sizes: dict[str, Any] = field(default_factory=dict)  # every module-level int constant, as fitted
    original_sizes: dict[str, Any] = field(default_factory=dict)  # the constants that fitting changed, as written
    input_mb: float = 0.0  # bytes of get_inputs() at the fitted size, in MiB
    original_input_mb: float = 0.0
    output_mb: float = 0.0  # bytes of one forward's outputs at the fitted size, in MiB (0: not known)

    @property
    def fitted(self) -> bool:
        return bool(self.original_sizes)

    def to_json(self) -> dict[str, Any]:
        """The task as a JSON object (the code included)."""
        return asdict(self)

    def summary(self) -> dict[str, Any]:
        """The short JSON form listed by `kernelsearch tasks --json`."""
        return {
            "id": self.id,
            "level": self.level,
            "problem_id": self.problem_id,
            "name": self.name,
            "input_mb": round(self.input_mb, 3),
            "original_input_mb": round(self.original_input_mb, 3),
            "sizes": dict(self.sizes),
            "fitted_from": dict(self.original_sizes),
            "origin": self.origin,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Task":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass(frozen=True)
class TaskError:
    """A task that could not be loaded or fitted, and why (one line)."""

    id: str
    reason: str
