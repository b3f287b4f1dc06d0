"""The budget view of `kernelsearch report --by UNIT [--compare] [--plot PNG]`: tables, figure and JSON.

It puts several runs (one per strategy, say) on one axis of compute spent per task, using the estimator
of `search.budget` (stated in `search.stats`): expected pass, fast_1.0 and best speedup against the
budget, for all tasks and per level, and with `--compare` the budget at which one run overtakes another.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from search.budget import (UNIT_TEXT, BudgetError, CurveSummary, TaskChains, TaskCurve, budget_grid, budget_records,
                           chains_by_task, overtake, summarize_curves, table_budgets, task_curve)
from search.stats import FAST_PS, RunStats

METRICS = (("pass", "pass"), ("fast_1.0", "fast_1.0"), ("best", "E[best x eager]"))
COMPARED = ("pass", "fast_1.0")


@dataclass
class RunBudget:
    """One run on the budget axis: its per-task curves and their summaries (all tasks, each level)."""

    label: str
    tasks: list[TaskChains]
    curves: list[TaskCurve]
    summary: CurveSummary
    by_level: dict[str, CurveSummary]
    missing_costs: int


def format_budget(b: float, unit: str) -> str:
    if unit == "samples":
        return f"{b:g}"
    if unit == "tokens":
        return f"{b:,.0f}"
    return f"{b:.3g} s" if b < 1000 else f"{b:,.0f} s"


def _clean(x: Any) -> Any:
    """NaN and inf as None, numpy numbers as Python ones: the report's JSON allows no NaN."""
    if isinstance(x, np.ndarray):
        return [_clean(v) for v in x.tolist()]
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x


def _summary_json(s: CurveSummary) -> dict[str, Any]:
    return _clean({"tasks": s.tasks, "tasks_total": s.total,
                   **{name: {"mean": s.mean[name], "low": s.low[name], "high": s.high[name]} for name in s.mean}})


def build(labels: Sequence[str], runs: Sequence[RunStats], unit: str,
          ps: Sequence[float] = FAST_PS) -> tuple[np.ndarray, list[RunBudget], list[str]]:
    """The shared budget grid, each usable run's curves, and notes (runs left out, and why)."""
    notes: list[str] = []
    usable: list[tuple[str, list[TaskChains], int]] = []
    for label, rs in zip(labels, runs):
        records = budget_records(rs.records, rs.config, correct=rs.correct, timed=rs.timed)
        tasks, missing = chains_by_task(records, unit)
        judged = sum(ch.rounds for t in tasks for ch in t.chains)
        if unit == "gpu-seconds" and judged and missing == judged:
            notes.append(f"{label}: no generation seconds recorded (a run from before they were), so it is left out "
                         f"of the budget in gpu-seconds; --by tokens or --by samples include it")
            continue
        if missing:
            notes.append(f"{label}: {missing} samples have no generation seconds (their generation failed) and "
                         f"count only their oracle seconds")
        if unit == "gpu-seconds" and records.unclocked:
            notes.append(f"{label}: {records.unclocked} samples that failed on the oracle came back without its "
                         f"device seconds and count their generation seconds only")
        if not tasks:
            notes.append(f"{label}: no judged sample, so nothing on the budget axis")
            continue
        usable.append((label, tasks, missing))
    budgets = budget_grid([t for _, tasks, _ in usable for t in tasks], unit)
    out = []
    for label, tasks, missing in usable:
        curves = [task_curve(t, budgets, ps) for t in tasks]
        levels = sorted({c.level for c in curves})
        by_level = {lv: summarize_curves([c for c in curves if c.level == lv], budgets, ps) for lv in levels}
        out.append(RunBudget(label, tasks, curves, summarize_curves(curves, budgets, ps), by_level, missing))
        if any(t.chains and max(ch.rounds for ch in t.chains) > 1 for t in tasks):
            n_chains = sum(len(t.chains) for t in tasks)
            notes.append(f"{label}: {n_chains} chains of up to "
                         f"{max(ch.rounds for t in tasks for ch in t.chains)} rounds are the unit a budget buys")
    return budgets, out, notes


def _thinned(s: CurveSummary, j: int) -> bool:
    """Some tasks, not all, are left out at budget j."""
    return bool(0 < s.tasks[j] < s.total)


def _cell(s: CurveSummary, name: str, j: int, speedup: bool = False) -> str:
    if s.tasks[j] == 0 or not np.isfinite(s.mean[name][j]):
        return ""
    mark = "*" if _thinned(s, j) else ""
    if speedup:
        return f"{s.mean[name][j]:.2f}x{mark} [{s.low[name][j]:.2f}, {s.high[name][j]:.2f}]"
    return f"{s.mean[name][j]:.3f}{mark} [{s.low[name][j]:.2f}, {s.high[name][j]:.2f}]"


def tables(budgets: np.ndarray, runs: Sequence[RunBudget], unit: str) -> list[Table]:
    rows = table_budgets(budgets, unit)
    thinned = any(_thinned(r.summary, j) for r in runs for j in rows)
    caption = "budget: " + UNIT_TEXT[unit] + " per task" + (
        "; * some tasks are left out at this budget (it is beyond what they recorded)" if thinned else "")
    out = []
    for name, title in METRICS:
        table = Table(title=escape(f"{title} at budget [95% CI] · by {unit}"), caption=caption)
        table.add_column(unit, justify="right")
        for r in runs:
            table.add_column(escape(r.label), justify="right")
        for j in rows:
            table.add_row(format_budget(budgets[j], unit), *(_cell(r.summary, name, j, name == "best") for r in runs))
        out.append(table)
    levels = sorted({lv for r in runs for lv in r.by_level})
    if len(levels) > 1:
        table = Table(title=escape(f"by level: pass · fast_1.0 · E[best x eager] at budget · by {unit}"), caption=caption)
        table.add_column(unit, justify="right")
        cols = [(r, lv) for r in runs for lv in levels if lv in r.by_level]
        for r, lv in cols:
            table.add_column(escape(f"{r.label} · {lv}"), justify="right")
        for j in rows:
            cells = []
            for r, lv in cols:
                s = r.by_level[lv]
                if s.tasks[j] == 0:
                    cells.append("")
                    continue
                mark = "*" if _thinned(s, j) else ""
                cells.append(f"{s.mean['pass'][j]:.2f} · {s.mean['fast_1.0'][j]:.2f} · {s.mean['best'][j]:.2f}x{mark}")
            table.add_row(format_budget(budgets[j], unit), *cells)
        out.append(table)
    return out


def comparisons(budgets: np.ndarray, runs: Sequence[RunBudget]) -> list[dict[str, Any]]:
    """Every pair of runs that share tasks, on each compared metric."""
    out = []
    for i in range(len(runs)):
        for k in range(i + 1, len(runs)):
            a, b = runs[i], runs[k]
            for metric in COMPARED:
                o = overtake(a.curves, b.curves, (a.label, b.label), budgets, metric)
                out.append({"runs": [a.label, b.label], **o.to_json()})
    return out


def compare_table(rows: list[dict[str, Any]], unit: str) -> Table:
    table = Table(title=escape(f"overtaking · by {unit}"),
                  caption="on the tasks both ran, up to the budget at which all of them are in both runs; for good: "
                          "ahead there and not behind at any larger budget; interval and resamples: paired bootstrap "
                          "over tasks")
    cols = ("ahead first", "overtaken by", "metric", "for good from", "95% CI", "resamples", "lead changes", "tasks",
            "compared up to")
    for col in cols:
        table.add_column(col, justify="left" if col in cols[:3] else "right")
    for r in rows:
        upto = format_budget(r["max_budget"], unit) if r["max_budget"] is not None else "-"
        a, b = (escape(x) for x in r["runs"])
        if r["max_budget"] is None:
            table.add_row(f"{a} / {b}", "-", r["metric"], "no common budget", "", "", "", str(r["tasks"]), upto)
            continue
        if r["leader"] is None:
            table.add_row(f"{a} = {b} (tied)", "-", r["metric"], "-", "", "", "0", str(r["tasks"]), upto)
            continue
        at = format_budget(r["budget"], unit) if r["budget"] is not None else "not within range"
        low = format_budget(r["low"], unit) if r["low"] is not None else "beyond"
        high = format_budget(r["high"], unit) if r["high"] is not None else "beyond"
        interval = f"[{low}, {high}]" if r["crossing_share"] > 0 else ""
        table.add_row(escape(r["leader"]), escape(r["other"]), r["metric"], at, interval, f"{r['crossing_share']:.0%}",
                      str(r["lead_changes"]), str(r["tasks"]), upto)
    return table


def plot(path: Path, budgets: np.ndarray, runs: Sequence[RunBudget], unit: str) -> None:
    """One line per run with its 95% band, a column per metric and a row for all tasks and each level."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    levels = sorted({lv for r in runs for lv in r.by_level})
    groups = [("all tasks", None)] + ([(lv, lv) for lv in levels] if len(levels) > 1 else [])
    fig = Figure(figsize=(12, 3.3 * len(groups) + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = np.atleast_2d(fig.subplots(len(groups), len(METRICS), squeeze=False))
    colors = [f"C{i}" for i in range(10)]
    thinned = False
    top = 1.0
    ticks: list[float] = []
    if len(budgets):
        powers = list(range(math.ceil(math.log2(budgets[0]) - 1e-9), math.floor(math.log2(budgets[-1]) + 1e-9) + 1))
        ticks = [2.0 ** i for i in powers[::max(1, math.ceil(len(powers) / 7))]]
    for gi, (gname, level) in enumerate(groups):
        for mi, (name, title) in enumerate(METRICS):
            ax = axes[gi, mi]
            for ri, r in enumerate(runs):
                s = r.summary if level is None else r.by_level.get(level)
                if s is None or len(budgets) == 0:
                    continue
                have = s.tasks > 0
                full = s.tasks == s.total
                cut = int(np.argmin(full)) if not full.all() else len(budgets)
                thinned |= bool(have[cut:].any())
                color = colors[ri % len(colors)]
                # the estimates are constant between the budgets at which another chain fits: steps
                ax.fill_between(budgets[have], s.low[name][have], s.high[name][have], color=color, alpha=0.15,
                                linewidth=0, step="post")
                label = f"{r.label} ({s.total} tasks)" if gi == 0 else None
                ax.plot(budgets[:cut], s.mean[name][:cut], color=color, label=label, drawstyle="steps-post")
                tail = np.arange(max(cut - 1, 0), len(budgets))
                tail = tail[have[tail]]
                if len(tail):
                    ax.plot(budgets[tail], s.mean[name][tail], color=color, linestyle="--", drawstyle="steps-post",
                            label=label if cut == 0 else None)
                if name == "best":
                    top = max(top, float(np.nanmax(np.where(have, s.high[name], np.nan), initial=1.0)))
            ax.set_xscale("log", base=2)
            ax.grid(True, which="major", alpha=0.3)
            ax.set_title(f"{title} · {gname}", fontsize="medium")
            if gi == len(groups) - 1:
                ax.set_xlabel(f"budget per task ({UNIT_TEXT[unit]})")
            if name != "best":
                ax.set_ylim(-0.02, 1.02)
            if len(budgets):
                ax.set_xticks(ticks, [format_budget(t, unit) for t in ticks])
                ax.set_xlim(budgets[0] / 2 ** 0.25, budgets[-1] * 2 ** 0.25)
        axes[gi, 0].set_ylabel("fraction of tasks")
        axes[gi, 2].set_ylabel("speedup vs eager")
    for gi in range(len(groups)):
        axes[gi, 2].set_ylim(0, top * 1.05)
    if runs:
        axes[0, 0].legend(loc="upper left", fontsize="small")
    fig.suptitle("at equal budget: bands 95% bootstrap over tasks"
                 + ("; dashed: some tasks are left out (beyond what they recorded)" if thinned else ""),
                 fontsize="small")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, format="png")


def budget_report(labels: Sequence[str], runs: Sequence[RunStats], unit: str, console: Console, compare: bool,
                  plot_path: Path | None) -> dict[str, Any]:
    """Print the budget view of `runs` on `console`, draw it to `plot_path` if given; return its JSON."""
    budgets, built, notes = build(labels, runs, unit)
    for table in tables(budgets, built, unit):
        console.print(table)
    rows: list[dict[str, Any]] = []
    if compare:
        rows = comparisons(budgets, built)
        if rows:
            console.print(compare_table(rows, unit))
        else:
            notes.append("--compare needs two runs on the budget axis")
    for note in notes:
        console.print(f"[dim]note: {escape(note)}[/]", highlight=False)
    if plot_path is not None:
        plot(Path(plot_path), budgets, built, unit)
        console.print(f"plot written to {escape(str(plot_path))}", highlight=False)
    return _clean({
        "by": unit, "unit": UNIT_TEXT[unit], "budgets": budgets.astype(int) if unit == "samples" else budgets,
        "runs": [{"label": r.label, "tasks": len(r.tasks), "chains": sum(len(t.chains) for t in r.tasks),
                  "missing_costs": r.missing_costs, "all": _summary_json(r.summary),
                  "by_level": {lv: _summary_json(s) for lv, s in r.by_level.items()}} for r in built],
        "compare": rows, "notes": notes,
    })


__all__ = ["BudgetError", "budget_report", "build", "format_budget"]
