"""The `kernelsearch` command line. Each command is a thin layer over the packages it drives."""

from __future__ import annotations

import json
import shutil
import sys

import typer
from rich.console import Console
from rich.table import Table

from search import options as opt
from tasks import LoadResult, Selection, SelectionError, SourceError, load_tasks
from tasks.fitting import default_budget_mb

app = typer.Typer(
    help="Best-of-n search for fast, verified GPU kernels from small local code models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)


@app.callback()
def _root() -> None:
    """Best-of-n search for fast, verified GPU kernels from small local code models."""


def fail(message: str, code: int = 2) -> None:
    """A user error: one line on stderr, no traceback."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if shutil.which("nvidia-smi") and default_budget_mb("cuda") != default_budget_mb("cpu") else "cpu"
    if device not in ("cpu", "cuda"):
        fail(f"--device must be cpu or cuda, not '{device}'")
    return device


def select_tasks(source: str, level: int | None, ids: str | None, tasks: str | None, max_input_mb: float | None, device: str) -> LoadResult:
    """Load the selected tasks fitted to the budget; report malformed ones and go on."""
    try:
        selection = Selection.from_flags(level, ids, tasks)
    except SelectionError as exc:
        fail(str(exc))
    budget = max_input_mb if max_input_mb is not None else default_budget_mb(device)
    try:
        with err_console.status("loading tasks...", spinner="dots"):
            result = load_tasks(source, selection, budget)
    except SourceError as exc:
        fail(str(exc))
    for error in result.errors:
        err_console.print(f"[yellow]skipped[/] {error.id}: {error.reason}", highlight=False, soft_wrap=True)
    if selection.task_ids:
        unknown = sorted(selection.task_ids - {t.id for t in result.tasks} - {e.id for e in result.errors})
        for task_id in unknown:
            err_console.print(f"[yellow]unknown task[/] {task_id} in {source}", highlight=False)
    return result


@app.command("tasks")
def tasks_command(
    source: opt.Source = "builtin",
    level: opt.Level = None,
    ids: opt.Ids = None,
    tasks: opt.TaskIds = None,
    max_input_mb: opt.MaxInputMb = None,
    device: opt.Device = "auto",
    as_json: opt.Json = False,
) -> None:
    """List tasks at their fitted size."""
    result = select_tasks(source, level, ids, tasks, max_input_mb, resolve_device(device))
    if as_json:
        print(json.dumps([t.summary() for t in result.tasks]))
        return
    table = Table(title=f"{len(result.tasks)} tasks from {source}")
    for col in ("id", "level", "problem", "input MB", "fitted from"):
        table.add_column(col, justify="right" if col in ("level", "problem", "input MB") else "left")
    for t in result.tasks:
        fitted = ", ".join(f"{k} {v}->{t.sizes[k]}" for k, v in t.original_sizes.items())
        table.add_row(t.id, str(t.level), str(t.problem_id), f"{t.input_mb:.1f}", fitted or "-")
    console.print(table)
    if result.errors:
        err_console.print(f"{len(result.errors)} task(s) skipped (reasons above)")


def main() -> None:  # pragma: no cover - console-script entry for `python -m search.cli`
    sys.exit(app())


if __name__ == "__main__":  # pragma: no cover
    main()
