"""Load tasks from a KernelBench checkout, a KernelBench data file (JSONL or parquet), or our built-ins.

Every loader yields `RawTask`s; `load_tasks` selects, fits and checks them. A malformed task becomes a
`TaskError` with its id and the reason, and the other tasks still load.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from tasks.fitting import MIB, FitError, fit
from tasks.model import Task, TaskError
from tasks.runtime import TaskCodeError, check_runs, exec_task_code
from tasks.selection import Selection

BUILTIN_DIR = Path(__file__).parent / "builtin"
_LEVEL_DIR = re.compile(r"^level(\d+)$")
_PROBLEM_FILE = re.compile(r"^(\d+)_(.+)\.py$")


class SourceError(Exception):
    """The task source itself cannot be read (missing path, unknown format, unreadable file)."""


@dataclass(frozen=True)
class RawTask:
    id: str
    level: int | None
    problem_id: int | None
    name: str
    code: str
    origin: str


@dataclass
class LoadResult:
    tasks: list[Task] = field(default_factory=list)
    errors: list[TaskError] = field(default_factory=list)


@dataclass
class Selected:
    """A source's selected tasks as written, before fitting (`read_selected`), and the source's malformed rows."""

    raws: list[RawTask]
    errors: list[TaskError]


def read_directory(root: Path, prefix: str | None = None) -> list[RawTask]:
    """Problems laid out as `levelN/<id>_<Name>.py` under `root` (or under `root/KernelBench`).

    Ids are `levelN/<stem>`; with `prefix` (the built-ins) they are `<prefix>/<stem>`.
    """
    if (root / "KernelBench").is_dir():
        root = root / "KernelBench"
    level_dirs = sorted(
        (int(m.group(1)), d) for d in root.iterdir() if d.is_dir() and (m := _LEVEL_DIR.match(d.name))
    )
    if not level_dirs:
        raise SourceError(f"{root}: no level1/, level2/ ... folders (expected a KernelBench checkout)")
    raws = []
    for level, d in level_dirs:
        for f in sorted(d.glob("*.py"), key=lambda p: _problem_sort_key(p.name)):
            m = _PROBLEM_FILE.match(f.name)
            problem_id = int(m.group(1)) if m else None
            stem = f.stem
            raws.append(
                RawTask(
                    id=f"{prefix or f'level{level}'}/{stem}",
                    level=level,
                    problem_id=problem_id,
                    name=stem,
                    code=f.read_text(encoding="utf-8", errors="replace"),
                    origin=str(f),
                )
            )
    return raws


def _problem_sort_key(name: str) -> tuple[int, str]:
    m = _PROBLEM_FILE.match(name)
    return (int(m.group(1)) if m else 1 << 30, name)


def read_data_file(path: Path) -> tuple[list[RawTask], list[TaskError]]:
    """Rows of the dataset's fields `level`, `problem_id`, `name`, `code` (JSONL, JSON list or parquet)."""
    rows: list[tuple[str, object]] = []
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq

            table = pq.read_table(path)
        except Exception as exc:  # noqa: BLE001 - a broken file is a source error, not a crash
            raise SourceError(f"{path}: cannot read parquet: {exc}") from None
        rows = [(f"{path}:row{i + 1}", r) for i, r in enumerate(table.to_pylist())]
    elif suffix in (".jsonl", ".json"):
        text = path.read_text(encoding="utf-8", errors="replace")
        if suffix == ".json" and text.lstrip().startswith("["):
            try:
                rows = [(f"{path}:item{i + 1}", r) for i, r in enumerate(json.loads(text))]
            except json.JSONDecodeError as exc:
                raise SourceError(f"{path}: not valid JSON: {exc}") from None
        else:
            for n, line in enumerate(text.splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    rows.append((f"{path}:{n}", json.loads(line)))
                except json.JSONDecodeError as exc:
                    rows.append((f"{path}:{n}", f"line {n} is not JSON ({exc.msg})"))
    else:
        raise SourceError(f"{path}: unknown data file type (expected .jsonl, .json or .parquet)")

    raws, errors = [], []
    for origin, row in rows:
        if isinstance(row, str):
            errors.append(TaskError(id=origin, reason=row))
            continue
        missing = [k for k in ("level", "problem_id", "name", "code") if not isinstance(row, dict) or k not in row]
        if missing:
            errors.append(TaskError(id=origin, reason=f"row lacks field(s) {', '.join(missing)}"))
            continue
        try:
            level, problem_id = int(row["level"]), int(row["problem_id"])
        except (TypeError, ValueError):
            errors.append(TaskError(id=origin, reason="level and problem_id must be integers"))
            continue
        name = str(row["name"]).removesuffix(".py")
        raws.append(RawTask(f"level{level}/{name}", level, problem_id, name, str(row["code"]), origin))
    return raws, errors


def read_source(source: str | Path) -> tuple[list[RawTask], list[TaskError]]:
    """All raw tasks of a source: `builtin`, a directory (KernelBench checkout), or a data file."""
    if str(source) == "builtin":
        return read_directory(BUILTIN_DIR, prefix="builtin"), []
    path = Path(source).expanduser()
    if not path.exists():
        raise SourceError(f"{source}: no such file or directory (use 'builtin', a KernelBench checkout or a data file)")
    if path.is_dir():
        return read_directory(path), []
    return read_data_file(path)


def build_task(raw: RawTask, max_input_mb: float | None) -> Task:
    """Fit a raw task to the budget and check it; raises TaskCodeError or FitError with the reason."""
    exec_task_code(raw.code, raw.origin)  # syntax and the three required names, with a clear message
    try:
        result = fit(raw.code, max_input_mb, raw.origin)
    except TaskCodeError:
        raise
    except FitError:
        raise
    except Exception as exc:  # noqa: BLE001 - get_inputs or the model failed while being measured
        raise TaskCodeError(f"measuring the task failed: {type(exc).__name__}: {exc}".splitlines()[0]) from None
    if result.meta_error:
        # The meta device could not run it: check the model for real at the (now small) fitted size.
        check_runs(exec_task_code(result.code, raw.origin))
    return Task(
        id=raw.id,
        level=raw.level,
        problem_id=raw.problem_id,
        name=raw.name,
        code=result.code,
        origin=raw.origin,
        sizes=result.sizes,
        original_sizes=result.original_sizes,
        input_mb=result.input_bytes / MIB,
        original_input_mb=result.original_input_bytes / MIB,
        output_mb=result.output_bytes / MIB,
    )


def read_selected(source: str | Path, selection: Selection | None = None) -> Selected:
    """The selected tasks of a source as written, not yet fitted (`raws`): quick, since nothing is run, so a bad
    source or an empty selection is known before anything slow starts. Raises SourceError only for the source."""
    raws, errors = read_source(source)
    selection = selection or Selection()
    return Selected(raws=[r for r in raws if selection.matches(r.id, r.level, r.problem_id)],
                    errors=[e for e in errors if selection.is_open()])


def fit_selected(selected: Selected, max_input_mb: float | None = None) -> LoadResult:
    """Fit and check `read_selected`'s tasks (runs each task's code: seconds for a level's worth)."""
    result = LoadResult(errors=list(selected.errors))
    for raw in selected.raws:
        try:
            result.tasks.append(build_task(raw, max_input_mb))
        except (TaskCodeError, FitError) as exc:
            result.errors.append(TaskError(raw.id, str(exc)))
    return result


def load_tasks(source: str | Path, selection: Selection | None = None, max_input_mb: float | None = None) -> LoadResult:
    """Read, select, fit and check the tasks of a source. Raises SourceError only for the source itself."""
    return fit_selected(read_selected(source, selection), max_input_mb)
