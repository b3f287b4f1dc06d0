"""`kernelsearch report`: what one or more run folders add up to, side by side.

Read-only: a run folder is read without `RunStore.open` (which would create best/ and cut a torn last
line), so a report can be taken of a run that is still writing; the samples go through the store's one
reader (`search.store.read_samples`), so a sample in flight is skipped as it is everywhere, and a run made
before the current record format reads back too. Every problem with a folder is one line (`ReportError`),
never a traceback. With `as_json` the console gets the JSON object alone; notes go to `notes`.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from oracle.tolerance import DEFAULT_POLICY
from oracle.verdict import SAMPLE_STATUSES, SHORT_NAMES
from search.budget import UNITS as BUDGET_UNITS
from search.budget_view import budget_report
from search.stats import RunStats, TaskStats, powers_of_two
from search.store import RunStore, SampleRecord, StoreError, read_samples
from search.terminal import add_id_column

STATUS_COLUMNS = [s for s in SAMPLE_STATUSES if s != "correct"]  # "correct" has a column of its own
CSV_COLUMNS = ["run", "strategy", "task", "level", "samples", "correct", *STATUS_COLUMNS, "duplicates",
               "first_correct_sample_from_1", "best_speedup_vs_eager", "best_speedup_vs_compile", "best_retimed",
               "tokens", "device_s"]


class ReportError(Exception):
    """A run folder cannot be reported on (missing, or not shaped like a run); the message is one line."""


# ---------------------------------------------------------------- reading a run


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ReportError(f"{path}: {what} is not valid JSON ({exc.msg}, line {exc.lineno})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: cannot read {what} ({exc.__class__.__name__})") from None


def _read_samples(path: Path) -> list[SampleRecord]:
    try:
        return read_samples(path)
    except StoreError as exc:
        raise ReportError(str(exc)) from None


def load_run(path: Path) -> tuple[dict[str, Any], list[SampleRecord], dict[str, dict[str, Any]]]:
    """config, sample records and re-timed best verdicts of a run folder, or a ReportError."""
    if not path.exists():
        raise ReportError(f"{path}: no such run folder")
    if not path.is_dir():
        raise ReportError(f"{path}: not a folder")
    if not (path / "config.json").is_file():
        raise ReportError(f"{path} is not a run folder (no config.json)")
    config = _read_json(path / "config.json", "config.json")
    if not isinstance(config, dict):
        raise ReportError(f"{path / 'config.json'}: not a JSON object")
    if "plan" in config and not isinstance(config["plan"], dict):
        raise ReportError(f"{path / 'config.json'}: plan is not an object")
    tasks = config.get("tasks", [])
    if not isinstance(tasks, list) or not all(isinstance(t, dict) and isinstance(t.get("id"), str) for t in tasks):
        raise ReportError(f"{path / 'config.json'}: tasks is not a list of tasks with ids")
    if not (path / "samples.jsonl").is_file():
        raise ReportError(f"{path} is not a run folder (no samples.jsonl)")
    records = _read_samples(path / "samples.jsonl")
    store = RunStore(path)  # not RunStore.open: that writes to the folder
    best: dict[str, dict[str, Any]] = {}
    for tid in dict.fromkeys([t["id"] for t in tasks] + [r.task for r in records]):
        try:
            verdict = store.best(tid)
        except json.JSONDecodeError as exc:
            raise ReportError(f"{path}: best verdict of {tid} is not valid JSON ({exc.msg})") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ReportError(f"{path}: cannot read the best verdict of {tid} ({exc.__class__.__name__})") from None
        if verdict is not None:
            best[tid] = verdict
    return config, records, best


def run_stats(path: Path, tolerance: str | None = None) -> RunStats:
    """The run's statistics; `tolerance`: count correct under this policy instead of the run's own."""
    config, records, best = load_run(path)
    if tolerance not in (None, config.get("tolerance") or DEFAULT_POLICY) and "tolerance" not in config:
        raise ReportError(f"{path}: recorded before verdicts listed the tolerance policies they pass; it can only "
                          f"be counted under its own ({DEFAULT_POLICY})")
    try:
        return RunStats(records, config, best, tolerance=tolerance)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise ReportError(f"{path}: malformed run ({exc.__class__.__name__}: {exc})") from None


def _labels(run_dirs: list[Path]) -> list[str]:
    """Folder names, or whole paths where two runs share a name."""
    names = [p.name or str(p) for p in run_dirs]
    return [str(p) if names.count(n) > 1 else n for p, n in zip(run_dirs, names)]


# ---------------------------------------------------------------- rendering


def _f(x: float | None, digits: int = 3, suffix: str = "") -> str:
    return "-" if x is None else f"{x:.{digits}f}{suffix}"


def _status_text(t: TaskStats) -> str:
    parts = [f"{t.status_counts[s]} {SHORT_NAMES.get(s, s)}" for s in SAMPLE_STATUSES if t.status_counts.get(s)]
    if t.duplicates:
        parts.append(f"({t.duplicates} dup)")
    return ", ".join(parts) or "-"


def _any_left_out(runs: list[RunStats], at: str) -> bool:
    """Whether some task of some run has fewer than k samples at a shown k (`at`: "n" for pass@n only)."""
    for rs in runs:
        ks = [str(rs.n)] if at == "n" else [str(k) for k in powers_of_two(rs.n)]
        if any(rs.summary["tasks_at_k"].get(k, 0) < rs.summary["tasks_with_samples"] for k in ks if rs.n):
            return True
    return False


def _summary_table(labels: list[str], runs: list[RunStats]) -> Table:
    caption = "* some tasks have fewer than n samples and are left out of pass@n" if _any_left_out(runs, "n") else None
    table = Table(title="runs", caption=caption)
    for col, justify in (("run", "left"), ("strategy", "left"), ("tasks run", "right"), ("n", "right"),
                         ("samples", "right"), ("pass@1", "right"), ("pass@n [95% CI]", "right"),
                         ("fast_1.0@n", "right"), ("tokens", "right"), ("device s", "right")):
        table.add_column(col, justify=justify)
    for label, rs in zip(labels, runs):
        s, n = rs.summary, rs.n
        ci = rs.ci.get(str(n))
        mark = "*" if n and s["tasks_at_k"][str(n)] < s["tasks_with_samples"] else ""
        pass_n = f"{_f(s['pass_at_k'].get(str(n)))}{mark} [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "-"
        table.add_row(escape(label), escape(str(rs.strategy or "-")), f"{s['tasks_with_samples']}/{s['tasks']}", str(n),
                      str(s["samples"]), _f(s["pass_at_k"].get("1")), pass_n,
                      _f(s["fast_p_at_k"]["1.0"].get(str(n))), f"{rs.cost['tokens']:,}",
                      f"{rs.cost['device_s']:.1f}")
    return table


def _k_tables(labels: list[str], runs: list[RunStats]) -> tuple[Table, Table]:
    ks = sorted({k for rs in runs for k in powers_of_two(rs.n)})
    caption = "* some tasks have fewer than k samples and are left out at this k" if _any_left_out(runs, "k") else None
    passes = Table(title="pass@k [95% CI]", caption=caption)
    fast = Table(title=escape("fast_1.0@k · E[best x eager of k samples]"))
    for table in (passes, fast):
        table.add_column("k", justify="right")
        for label in labels:
            table.add_column(escape(label), justify="right")
    for k in ks:
        prow, frow = [str(k)], [str(k)]
        for rs in runs:
            key = str(k)
            if k > rs.n:
                prow.append("")
                frow.append("")
                continue
            mark = "*" if rs.summary["tasks_at_k"][key] < rs.summary["tasks_with_samples"] else ""
            ci = rs.ci.get(key)
            prow.append(f"{_f(rs.summary['pass_at_k'][key])}{mark}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""))
            frow.append(f"{_f(rs.summary['fast_p_at_k']['1.0'][key])} · {_f(rs.summary['expected_best_speedup'][key], 2, 'x')}")
        passes.add_row(*prow)
        fast.add_row(*frow)
    return passes, fast


def _level_table(labels: list[str], runs: list[RunStats]) -> Table | None:
    if all(len(rs.by_level) <= 1 for rs in runs):
        return None
    table = Table(title="by level")
    for col in ("run", "level", "tasks", "samples", "pass@1", "pass@n", "fast_1.0@n"):
        table.add_column(col, justify="left" if col in ("run", "level") else "right")
    for label, rs in zip(labels, runs):
        for level, block in rs.to_json()["by_level"].items():
            n = str(block["n"])
            table.add_row(escape(label), escape(level), str(block["tasks"]), str(block["samples"]), _f(block["pass_at_k"].get("1")),
                          f"{_f(block['pass_at_k'].get(n))} @{n}", _f(block["fast_p_at_k"]["1.0"].get(n)))
    return table


def _task_table(label: str, rs: RunStats, width: int = 200) -> Table:
    table = Table(title=f"tasks of {escape(label)}",
                  caption="#1: a task's first sample; best: the best/ kernel, re-timed; (sample): its own "
                          "timing (the task's only correct kernel, or a run cut before best/)")
    add_id_column(table, "task", rs.tasks, room=width - 75)  # the other columns need about 75
    for col, justify in (("samples", "right"), ("statuses", "left"),
                         ("first correct", "right"), ("best x eager", "right"), ("best x compile", "right")):
        table.add_column(col, justify=justify)
    for t in rs.tasks.values():
        retimed = "" if t.best_retimed or t.best_speedup_vs_eager is None else " (sample)"
        table.add_row(escape(t.task), str(t.samples), escape(_status_text(t)),
                      "-" if t.first_correct_sample_from_1 is None else f"#{t.first_correct_sample_from_1}",
                      _f(t.best_speedup_vs_eager, 2) + retimed, _f(t.best_speedup_vs_compile, 2))
    return table


def _notes(label: str, rs: RunStats) -> list[str]:
    notes = []
    if rs.unsampled:
        notes.append(f"{label}: {len(rs.unsampled)} of {len(rs.tasks)} tasks have no judged sample (not reached, "
                     f"or all cancelled) and are left out of every k")
    left = rs.left_out
    if left:
        first = min(left, key=int)
        notes.append(f"{label}: from k={first} on, up to {max(left.values())} of {rs.summary['tasks_with_samples']} "
                     f"tasks have fewer than k samples (early stop or an unfinished run) and are left out there (*); "
                     f"early-stopped tasks are solved ones, so pass@k at those k reads low")
    unsupported = sum(t.unsupported for t in rs.tasks.values())
    if unsupported:
        notes.append(f"{label}: {unsupported} sample(s) could not be judged here (unsupported, e.g. Triton not "
                     "installed) and are left out of pass@k: neither the model's success nor its failure")
    if not rs.compile_available:
        notes.append(f"{label}: no torch.compile baseline, so no speedups vs compile")
    if rs.tolerance != rs.run_tolerance:
        untimed = sum(1 for r in rs.records if rs.correct(r) and not rs.timed(r))
        notes.append(f"{label}: correct counted under the {rs.tolerance} tolerance policy (the run judged under "
                     f"{rs.run_tolerance}), from the verdicts' recorded figures"
                     + (f"; {untimed} sample(s) correct only under {rs.tolerance} were never timed and count as "
                        "not fast" if untimed else ""))
    return notes


def _plot(path: Path, labels: list[str], runs: list[RunStats]) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2, sharey=True)
    for ax, title in zip(axes, ("pass@k", "fast$_{1.0}$@k (correct and faster than eager)")):
        ax.set_title(title)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("k (samples per task)")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(True, which="major", alpha=0.3)
    axes[0].set_ylabel("fraction of tasks")
    max_n = max((rs.n for rs in runs), default=1)
    thinned = False
    for label, rs in zip(labels, runs):
        ks = list(range(1, rs.n + 1))
        if not ks:
            continue
        # where some tasks are left out (fewer samples than k) the line goes dashed with hollow markers
        full = [k for k in ks if rs.summary["tasks_at_k"][str(k)] == rs.summary["tasks_with_samples"]]
        cut = full[-1] if full and full == ks[:len(full)] else 0
        thinned |= cut < rs.n
        marked = set(powers_of_two(rs.n))  # markers at 1, 2, 4, ..., n: a large n would crowd the right end
        color = None
        for ax, values in ((axes[0], rs.summary["pass_at_k"]), (axes[1], rs.summary["fast_p_at_k"]["1.0"])):
            solid = [k for k in ks if k <= cut]
            dashed = [k for k in ks if k >= max(cut, 1)] if cut < rs.n else []
            if solid:
                line, = ax.plot(solid, [values[str(k)] for k in solid], marker="o", markersize=4, color=color,
                                markevery=[i for i, k in enumerate(solid) if k in marked], label=f"{label} (n={rs.n})")
                color = line.get_color()
            if dashed:
                line, = ax.plot(dashed, [values[str(k)] for k in dashed], marker="o", markersize=4, linestyle="--",
                                markerfacecolor="white", color=color,
                                markevery=[i for i, k in enumerate(dashed) if k in marked and k > cut],
                                label=None if solid else f"{label} (n={rs.n})")
                color = line.get_color()
    ticks = powers_of_two(max_n)
    for ax in axes:
        ax.set_xticks(ticks, [str(k) for k in ticks])
        ax.set_xlim(0.8, max(max_n, 2) * 1.25)
    if any(rs.n for rs in runs):
        axes[0].legend(loc="lower right", fontsize="small")
    if thinned:
        fig.suptitle("dashed, hollow: some tasks have fewer than k samples and are left out there", fontsize="small")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, format="png")


def _write_csv(path: Path, labels: list[str], runs: list[RunStats]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_COLUMNS)
        for label, rs in zip(labels, runs):
            for t in rs.tasks.values():
                row = {"run": label, "strategy": rs.strategy or "", "task": t.task, "level": t.level,
                       "samples": t.samples, "correct": t.correct, "duplicates": t.duplicates,
                       "first_correct_sample_from_1": t.first_correct_sample_from_1,
                       "best_speedup_vs_eager": t.best_speedup_vs_eager,
                       "best_speedup_vs_compile": t.best_speedup_vs_compile, "best_retimed": t.best_retimed,
                       "tokens": t.tokens, "device_s": round(t.device_s, 6)}
                for status in STATUS_COLUMNS:
                    row[status] = t.status_counts.get(status, 0)
                writer.writerow(["" if row[c] is None else row[c] for c in CSV_COLUMNS])


def report(run_dirs: list[Path], console: Console, as_json: bool, csv_path: Path | None,
           plot_path: Path | None, by: str | None = None, compare: bool = False,
           notes: Console | None = None, tolerance: str | None = None) -> dict[str, Any]:
    """Render the runs as tables on `console` (or, with `as_json`, print the JSON object alone there, on one
    line), write the CSV and the plot if asked, and return the JSON object. With `by` (a budget unit;
    `compare` implies samples) the budget view follows (`search.budget_view`), and the plot is its figure.
    `notes`: where the lines about written files go (default: `console`, unless it carries the JSON).
    `tolerance`: count samples correct under this policy (from their verdicts' `passes`), not the run's own."""
    if not run_dirs:
        raise ReportError("no run folder given")
    by = "samples" if compare and by is None else by
    if by is not None and by not in BUDGET_UNITS:
        raise ReportError(f"--by must be one of {', '.join(BUDGET_UNITS)}, not '{by}'")
    run_dirs = [Path(p) for p in run_dirs]
    runs = [run_stats(p, tolerance) for p in run_dirs]
    labels = _labels(run_dirs)
    result = {"runs": [{"label": label, "path": str(path), **rs.to_json()}
                       for label, path, rs in zip(labels, run_dirs, runs)]}
    for run, label, rs in zip(result["runs"], labels, runs):
        run["notes"] = _notes(label, rs)
    notes = notes or (None if as_json else console)

    if not as_json:
        _print_tables(console, labels, runs, result)
    try:
        if by is not None:  # with --json its tables go nowhere: the JSON holds them
            view = Console(file=io.StringIO()) if as_json else console
            result["budget"] = budget_report(labels, runs, by, view, compare, plot_path)
            if plot_path is not None and as_json and notes is not None:
                notes.print(f"plot written to {escape(str(plot_path))}", highlight=False)
            plot_path = None  # drawn: the budget view's figure
        if csv_path is not None:
            _write_csv(Path(csv_path), labels, runs)
            if notes is not None:
                notes.print(f"per-task rows written to {escape(str(csv_path))}", highlight=False)
        if plot_path is not None:
            _plot(Path(plot_path), labels, runs)
            if notes is not None:
                notes.print(f"plot written to {escape(str(plot_path))}", highlight=False)
    except OSError as exc:
        raise ReportError(f"cannot write {exc.filename or 'the output'}: {exc.strerror or exc}") from None

    if as_json:
        console.print(json.dumps(result, allow_nan=False, default=str), soft_wrap=True, highlight=False, markup=False,
                      emoji=False)
    return result


def _print_tables(console: Console, labels: list[str], runs: list[RunStats], result: dict[str, Any]) -> None:
    console.print(_summary_table(labels, runs))
    for table in _k_tables(labels, runs):
        console.print(table)
    level_table = _level_table(labels, runs)
    if level_table is not None:
        console.print(level_table)
    for label, rs in zip(labels, runs):
        console.print(_task_table(label, rs, console.width))
    for run in result["runs"]:
        for note in run["notes"]:
            console.print(f"[dim]note: {escape(note)}[/]", highlight=False)
