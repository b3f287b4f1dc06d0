"""The task selection shared by every command: `--level N`, `--ids 1-10,15`, `--tasks ID[,ID...]`."""

from __future__ import annotations

from dataclasses import dataclass


class SelectionError(ValueError):
    """A selection flag that cannot be parsed; the message says which and why."""


def parse_ids(text: str | None) -> frozenset[int] | None:
    """`1-10,15` -> {1, ..., 10, 15}; None or '' -> None (all)."""
    if not text:
        return None
    ids: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            a = int(lo)
            b = int(hi) if sep else a
        except ValueError:
            raise SelectionError(f"--ids: '{part}' is not a number or a range like 1-10") from None
        if b < a:
            raise SelectionError(f"--ids: range '{part}' runs backwards")
        ids.update(range(a, b + 1))
    return frozenset(ids)


def parse_task_ids(text: str | None) -> frozenset[str] | None:
    if not text:
        return None
    return frozenset(t.strip() for t in text.split(",") if t.strip())


@dataclass(frozen=True)
class Selection:
    level: int | None = None
    ids: frozenset[int] | None = None  # problem ids
    task_ids: frozenset[str] | None = None  # full task ids such as level1/19_ReLU

    @classmethod
    def from_flags(cls, level: int | None, ids: str | None, tasks: str | None) -> "Selection":
        return cls(level=level, ids=parse_ids(ids), task_ids=parse_task_ids(tasks))

    def is_open(self) -> bool:
        """True when nothing is filtered (so source-level errors are worth showing)."""
        return self.level is None and self.ids is None and self.task_ids is None

    def matches(self, task_id: str, level: int | None, problem_id: int | None) -> bool:
        if self.level is not None and level != self.level:
            return False
        if self.ids is not None and problem_id not in self.ids:
            return False
        if self.task_ids is not None and task_id not in self.task_ids:
            return False
        return True
