"""Progress of a run in the terminal: samples done of planned, and per task the best so far.

Plain lines when the output is not a terminal (rich's live display degrades to none there).
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tasks.model import Task


class RunProgress:
    def __init__(self, console: Console, tasks: list[Task], planned: int, recorded: list[dict[str, Any]]) -> None:
        self.console = console
        self.tasks = [t.id for t in tasks]
        self.planned = planned
        self.by_task: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in recorded:
            self.by_task[r["task"]].append(r)
        self.started = time.perf_counter()
        self.progress = Progress(TextColumn("[bold]samples"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[note]}"), TimeElapsedColumn(), console=console,
                                 transient=False, disable=not console.is_terminal)
        self.bar = self.progress.add_task("samples", total=planned, completed=len(recorded), note="")
        self.done = len(recorded)

    def __enter__(self) -> "RunProgress":
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def record(self, record: dict[str, Any]) -> None:
        self.by_task[record["task"]].append(record)
        self.done += 1
        correct = sum(1 for rs in self.by_task.values() for r in rs if r["status"] == "correct")
        note = f"{correct} correct"
        self.progress.update(self.bar, completed=self.done, note=note)
        if not self.console.is_terminal:
            speed = f" {record['speedup_vs_eager']:.2f}x" if record.get("speedup_vs_eager") else ""
            self.console.print(f"[{self.done}/{self.planned}] {record['task']} round {record['round']} sample "
                               f"{record['sample']}: {record['status']}{speed}", highlight=False)

    def print_summary(self, store: Any) -> None:
        table = Table(title=f"run {store.root}")
        for col in ("task", "samples", "correct", "first correct at", "best x eager", "best x compile"):
            table.add_column(col)
        for task_id in self.tasks:
            rows = sorted(self.by_task.get(task_id, []), key=lambda r: r.get("sample_number", 0))
            correct = [r for r in rows if r["status"] == "correct"]
            best = store.best(task_id) or {}
            table.add_row(task_id, str(len(rows)), str(len(correct)),
                          str(min(r["sample_number"] for r in correct) + 1) if correct else "-",
                          f"{best['speedup_vs_eager']:.2f}" if best.get("speedup_vs_eager") else "-",
                          f"{best['speedup_vs_compile']:.2f}" if best.get("speedup_vs_compile") else "-")
        self.console.print(table)
