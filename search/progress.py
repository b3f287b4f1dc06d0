"""The live report of a run: progress, a per-task table and correctness as n grows, updated as samples land.

On a terminal it is a rich `Live` display, redrawn about twice a second:
- progress: samples done of planned, samples per minute, the oracle slots busy and builds queued (when
  the pool's `stats()` is given: it is polled every ~2 s), elapsed time and ETA;
- per task: status, samples, their verdicts, correct, first correct at sample #, best speedup vs eager
  and vs torch.compile (the best sample's own timing; the re-timed best comes with the summary);
- pass@k and fast_1.0@k for k = 1, 2, 4, ... up to the samples so far (search.stats, the same unbiased
  estimators and conventions as `kernelsearch report`).

When the output is not a terminal (a log file, CI) there are no control codes: one plain line a sample,
and every `every` samples (and at the end) one line with pass@k and the progress figures.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Awaitable, Callable

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from oracle.verdict import SAMPLE_STATUSES, SHORT_NAMES, STYLES, ratio_text
from search.stats import RunStats, TaskStats, curve, fast_p_at_k, level_of, powers_of_two
from search.store import SampleRecord
from search.terminal import add_id_column
from search.words import plural
from tasks.model import Task

StatsFn = Callable[[], Awaitable[list[dict[str, Any]]]]


def fmt_duration(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds == float("inf"):
        return "-"
    seconds = int(round(max(0.0, seconds)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _x(v: float | None) -> str:
    return f"{ratio_text(v)}x" if v else "-"


class RunProgress:
    """Progress of a run, fed one sample record at a time through `record` (the controller's on_record).

    `tasks`, `planned` (samples of the whole run) and `recorded` (records already in the store, on resume)
    as before; optional:
    - `stats`: an async callable returning the oracle pool's per-actor dicts (`OraclePool.stats`); polled
      every `poll_s` seconds while `run(...)` awaits the search;
    - `every`: plain output prints a pass@k line every this many samples (default: about ten a run);
    - `max_rows`: the live task table shows at most this many tasks (running ones first), the rest as
      one line (default: what fits the terminal's height);
    - `title`: a line above the live report;
    - `stop_at`: the run's early-stop speedup (plan.target_speedup when early stop is on): a task with a
      correct sample that fast shows as "solved" (its remaining samples are cancelled, not recorded).
    """

    def __init__(self, console: Console, tasks: list[Task], planned: int, recorded: list[SampleRecord],
                 stats: StatsFn | None = None, every: int | None = None, poll_s: float = 2.0,
                 max_rows: int | None = None, title: str | None = None, stop_at: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.console = console
        self.tasks = [t.id for t in tasks]
        self.levels = {t.id: level_of(t.id, getattr(t, "level", None)) for t in tasks}
        self.planned = planned
        self.per_task = planned // len(tasks) if tasks else 0
        self.stats_fn = stats
        self.poll_s = poll_s
        self.every = every or max(len(self.tasks), planned // 10, 1)
        self.max_rows = max_rows
        self.title = title
        self.stop_at = stop_at
        self.clock = clock
        self.live_mode = console.is_terminal and not console.is_dumb_terminal
        self._lock = threading.RLock()
        self.by_task: dict[str, list[SampleRecord]] = {tid: [] for tid in self.tasks}
        self.stats: dict[str, TaskStats] = {tid: TaskStats(tid, self.levels[tid]) for tid in self.tasks}
        self.last_update: dict[str, float] = {}
        self.pool: list[dict[str, Any]] | None = None
        self.started = clock()
        self.done = 0
        for r in recorded:
            self._add(r)
        self.resumed = self.done  # recorded before this session: not part of the rate
        self._live: Live | None = None
        self._last_pass_at = -1

    # ------------------------------------------------------------ feeding

    def _add(self, record: SampleRecord) -> None:
        tid = record.task
        if tid not in self.stats:
            self.tasks.append(tid)
            self.levels[tid] = level_of(tid)
            self.by_task[tid] = []
            self.stats[tid] = TaskStats(tid, self.levels[tid])
        self.by_task[tid].append(record)
        RunStats._add(self.stats[tid], record)
        self.last_update[tid] = self.clock()
        self.done += 1

    def _replace(self, record: SampleRecord) -> bool:
        """A sample recorded again (with its task's compile baseline): it takes its earlier record's place and
        the task's figures are counted again. False when the sample is new."""
        rows = self.by_task.get(record.task, [])
        at = next((i for i, r in enumerate(rows) if r.sample_index == record.sample_index), None)
        if at is None:
            return False
        rows[at] = record
        self.stats[record.task] = TaskStats(record.task, self.levels[record.task])
        for r in rows:
            RunStats._add(self.stats[record.task], r)
        return True

    def record(self, record: SampleRecord) -> None:
        with self._lock:
            if self._replace(record):
                return
            first_correct = record.correct and self.stats.get(record.task, TaskStats("", "")).correct == 0
            self._add(record)
        if self.live_mode:
            return  # a terminal: the live display redraws itself twice a second (nothing to draw outside `with`)
        self._plain(self._sample_line(record))
        if first_correct:
            t = self.stats[record.task]
            self._plain(f"  first correct kernel for {record.task} at sample #{t.first_correct_sample_from_1}"
                        + (f" ({ratio_text(record.speedup_vs_eager)}x eager)" if record.speedup_vs_eager else ""))
        if (self.done - self.resumed) % self.every == 0 or self.done >= self.planned:
            self._plain(self.pass_line())
            self._last_pass_at = self.done

    async def poll_stats(self) -> None:
        """One poll of the pool's stats (errors leave the last figures in place)."""
        if self.stats_fn is None:
            return
        try:
            pool = await self.stats_fn()
        except Exception:  # noqa: BLE001 - a dead actor or a closing cluster must not stop the run
            return
        with self._lock:
            self.pool = list(pool)

    async def run(self, search: Awaitable[Any]) -> Any:
        """Await the search while polling the pool's stats every `poll_s` seconds; returns its result."""

        async def poll() -> None:
            while True:
                await self.poll_stats()
                await asyncio.sleep(self.poll_s)

        poller = asyncio.ensure_future(poll()) if self.stats_fn is not None else None
        try:
            return await search
        finally:
            if poller is not None:
                poller.cancel()
                try:
                    await poller
                except (asyncio.CancelledError, Exception):  # noqa: BLE001
                    pass

    # ------------------------------------------------------------ context: the live display

    def __enter__(self) -> "RunProgress":
        if self.live_mode:
            self._live = Live(console=self.console, get_renderable=self.renderable, refresh_per_second=2,
                              transient=True, redirect_stdout=False, redirect_stderr=False)
            self._live.__enter__()
        else:
            line = f"{self.title}: " if self.title else ""
            self._plain(f"{line}{plural(self.planned, 'sample')} planned over {plural(len(self.tasks), 'task')}"
                        + (f", {self.resumed} already recorded" if self.resumed else ""))
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            live, self._live = self._live, None
            live.__exit__(*exc)
            if exc and exc[0] is not None:  # interrupted: leave the last state on screen (transient cleared it)
                self.console.print(self.renderable())

    # ------------------------------------------------------------ figures

    def rate_per_min(self) -> float | None:
        elapsed = self.clock() - self.started
        new = self.done - self.resumed
        return new / elapsed * 60 if new and elapsed > 0 else None

    def eta_s(self) -> float | None:
        rate = self.rate_per_min()
        if not rate:
            return None
        return max(0, self.planned - self.done) / rate * 60

    def pool_text(self) -> str | None:
        if not self.pool:
            return None
        alive = [p for p in self.pool if not p.get("dead")]
        lost = sum(1 for p in self.pool if p.get("lost"))
        dead = len(self.pool) - len(alive) - lost
        on_device = sum(int(p.get("timing", 0)) for p in alive)  # being checked or timed
        slots = sum(int(p.get("device_slots", 1)) for p in alive)
        building = sum(int(p.get("building", 0)) for p in alive)
        queued = sum(int(p.get("queued", 0)) for p in alive)
        waiting = sum(int(p.get("device_waiting", 0)) for p in alive)  # built, waiting for a device slot
        text = (f"oracles {len(self.pool)}: on the device {on_device}/{slots}"
                + (f" ({waiting} waiting)" if waiting else "") + f", building {building}, builds queued {queued}")
        text += (f", {dead} restarting" if dead else "") + (f", {lost} lost with their node" if lost else "")
        # Where the device's time went so far (seconds by phase, all oracles): the check, the timing, and
        # each task's first reference and eager baseline.
        phases: dict[str, float] = {}
        for p in alive:
            for name, seconds in (p.get("device_phases_s") or {}).items():
                phases[name] = phases.get(name, 0.0) + float(seconds)
        shown = [f"{name} {phases[name]:.0f}" for name in ("checks", "compare", "timing", "reference", "baselines", "waiting")
                 if phases.get(name)]
        return text + (f"; device s: {', '.join(shown)}" if shown else "")

    def nodes_text(self) -> str | None:
        """Oracles per node where the pool spans several: `oracles per node: 10.0.0.2 (4c5af7) 1, ...`."""
        by_node: dict[str, list[dict[str, Any]]] = {}
        for p in self.pool or []:
            by_node.setdefault(p.get("node_label") or "-", []).append(p)
        if len(by_node) < 2:
            return None
        parts = [f"{label} {sum(not p.get('lost') for p in ps)}" + (" (lost)" if all(p.get("lost") for p in ps) else "")
                 for label, ps in by_node.items()]
        return "oracles per node: " + ", ".join(parts)

    def pass_curve(self) -> tuple[list[int], dict[int, dict[str, Any]], dict[int, dict[str, Any]]]:
        with self._lock:
            items = [t for t in self.stats.values() if t.samples]
            n = max((t.samples for t in items), default=0)
            ks = powers_of_two(n) if n else []
            passes = curve([(t.samples, t.correct) for t in items], ks)
            fast = curve([(t.samples, t.fast(1.0)) for t in items], ks, fast_p_at_k)
        return ks, passes, fast

    def pass_line(self) -> str:
        """One plain line: pass@k at 1, 2, 4, ... and where the run stands."""
        ks, passes, fast = self.pass_curve()
        tasks = sum(1 for t in self.stats.values() if t.samples)
        parts = []
        for k in ks:  # where some tasks have fewer than k samples, say over how many the mean is
            used = f" ({passes[k]['tasks']}/{tasks} tasks)" if passes[k]["left_out"] else ""
            parts.append(f"k={k} {passes[k]['mean']:.3f}{used}")
        head = f"pass@k over {plural(tasks, 'task')}: " + (" ".join(parts) if parts else "no samples yet")
        if ks:
            head += f" | fast_1.0@{ks[-1]} {fast[ks[-1]]['mean']:.3f}"
        pool = "; ".join(filter(None, (self.pool_text(), self.nodes_text())))
        return (f"{head} | {self.done}/{self.planned} samples, {self._rate_text()}, "
                f"elapsed {fmt_duration(self.clock() - self.started)}, ETA {fmt_duration(self.eta_s())}"
                + (f" | {pool}" if pool else ""))

    def _rate_text(self) -> str:
        rate = self.rate_per_min()
        return f"{rate:.1f} samples/min" if rate else "- samples/min"

    def _sample_line(self, record: SampleRecord) -> str:
        speed = f" {ratio_text(record.speedup_vs_eager)}x eager" if record.speedup_vs_eager and record.correct else ""
        dup = f" (repeats sample #{record.duplicate_of + 1})" if record.duplicate_of is not None else ""
        return f"[{self.done}/{self.planned}] {record.task} sample #{record.sample_index + 1}: {record.status}{speed}{dup}"

    def _plain(self, line: str) -> None:
        self.console.print(line, markup=False, highlight=False, soft_wrap=True, emoji=False)

    # ------------------------------------------------------------ renderables

    def task_status(self, tid: str) -> str:
        t = self.stats[tid]
        rows = self.by_task[tid]
        if not rows:
            return "waiting"
        if self.stop_at is not None and (t.best_sample_speedup_vs_eager or 0) >= self.stop_at:
            return "solved"
        if t.cancelled:
            return "stopped"
        if self.per_task and len(rows) >= self.per_task:
            return "done"
        return "running"

    def _status_text(self, t: TaskStats) -> Text:
        text = Text()
        for s in SAMPLE_STATUSES:
            c = t.status_counts.get(s)
            if c:
                if text:
                    text.append(", ")
                text.append(f"{c} {SHORT_NAMES[s]}", style=STYLES[s])
        return text if text else Text("-")

    def task_table(self, best: Callable[[str], dict[str, Any] | None] | None = None, limit: int | None = None) -> Table:
        """Per task: status, samples, verdicts, correct, first correct at #, best speedups.
        `best(task)`: a re-timed best verdict that replaces the best sample's timing (the summary)."""
        caption = None
        what = "the re-timed best kernel's speedup" if best else "the best correct sample's speedup"
        table = Table(title=f"tasks (x eager, x compile: {what})", title_justify="left", expand=False)
        # the figures take about 70 columns; verdicts wrap, ids fold beyond 40 columns (never cut)
        add_id_column(table, "task", list(self.tasks), room=self.console.size.width - 80, max_width=40)
        for col, justify in (("status", "left"), ("samples", "right"), ("correct", "right"), ("1st ok", "right"),
                             ("x eager", "right"), ("x compile", "right"), ("verdicts", "left")):
            table.add_column(col, justify=justify, no_wrap=col != "verdicts", min_width=10 if col == "verdicts" else None,
                             overflow="fold")
        with self._lock:
            order = list(self.tasks)
            if limit is not None and len(order) > limit:
                rank = {"running": 0, "done": 1, "solved": 1, "stopped": 1, "waiting": 2}
                shown = sorted(order, key=lambda tid: (rank[self.task_status(tid)], -self.last_update.get(tid, 0.0)))[:limit]
                hidden = [tid for tid in order if tid not in set(shown)]
                counts: dict[str, int] = {}
                for tid in hidden:
                    counts[self.task_status(tid)] = counts.get(self.task_status(tid), 0) + 1
                caption = f"... and {plural(len(hidden), 'more task', 'more tasks')}: " + ", ".join(f"{c} {s}" for s, c in sorted(counts.items()))
                order = [tid for tid in order if tid in set(shown)]
            for tid in order:
                t = self.stats[tid]
                verdict = best(tid) if best else None
                retimed = isinstance(verdict, dict) and verdict.get("status") == "correct" and verdict.get("speedup_vs_eager")
                eager = verdict.get("speedup_vs_eager") if retimed else t.best_sample_speedup_vs_eager
                comp = verdict.get("speedup_vs_compile") if retimed else t.best_sample_speedup_vs_compile
                status = self.task_status(tid)
                style = {"running": "cyan", "done": "", "solved": "green", "stopped": "", "waiting": "dim"}[status]
                samples = f"{t.samples}/{self.per_task}" if self.per_task else str(t.samples)
                table.add_row(escape(tid), Text(status, style=style), samples, str(t.correct),
                              "-" if t.first_correct_sample_from_1 is None else f"#{t.first_correct_sample_from_1}",
                              _x(eager), _x(comp), self._status_text(t))
        if caption:
            table.caption = caption
        return table

    def pass_table(self) -> Table:
        """pass@k and fast_1.0@k for k = 1, 2, 4, ... up to the samples so far: one column a k."""
        ks, passes, fast = self.pass_curve()
        table = Table(title="pass@k as n grows", title_justify="left")
        table.add_column("k", justify="left")
        for k in ks:
            table.add_column(str(k), justify="right")
        if not ks:
            table.add_column("-")
            table.add_row("pass@k", "no samples yet")
            return table
        thin = any(passes[k]["left_out"] for k in ks)
        table.add_row("pass@k", *[f"{passes[k]['mean']:.3f}" for k in ks])
        table.add_row("fast_1.0@k", *[f"{fast[k]['mean']:.3f}" for k in ks])
        table.add_row("tasks", *[str(passes[k]["tasks"]) for k in ks])
        if thin:
            table.caption = "tasks: those with k samples or more"
        return table

    def header(self) -> RenderableType:
        done, planned = self.done, self.planned
        bar = ProgressBar(total=max(planned, 1), completed=min(done, planned), width=30)
        line = Table.grid(padding=(0, 1))
        for _ in range(3):
            line.add_column()
        frac = f"{done / planned:.0%}" if planned else "-"
        line.add_row(Text("samples", style="bold"), bar,
                     Text(f"{done}/{planned} ({frac}) · {self._rate_text()} · elapsed "
                          f"{fmt_duration(self.clock() - self.started)} · ETA {fmt_duration(self.eta_s())}"))
        parts: list[RenderableType] = []
        if self.title:
            parts.append(Text(self.title, style="bold"))
        parts.append(line)
        for text in (self.pool_text(), self.nodes_text()):
            if text:
                parts.append(Text(text, style="dim"))
        return Group(*parts)

    def renderable(self) -> RenderableType:
        """The whole live report as one renderable (what the terminal shows)."""
        limit = self.max_rows
        if limit is None and self.live_mode:
            limit = max(3, self.console.size.height - 16)
        return Group(self.header(), self.task_table(limit=limit), self.pass_table())

    # ------------------------------------------------------------ after the run

    def print_table(self, renderable: RenderableType) -> None:
        """Print a table; in a log (not a terminal) at its natural width rather than squashed into 80 columns."""
        if self.live_mode:
            self.console.print(renderable)
            return
        saved = self.console._width  # Console.print(width=) cannot widen past the console's width
        self.console.width = max(self.console.width, 150)
        try:
            self.console.print(renderable, crop=False)
        finally:
            self.console._width = saved

    def print_summary(self, store: Any) -> None:
        """The final tables: per task with the re-timed best kernels, and pass@k; then where to look next."""
        if not self.live_mode and self._last_pass_at != self.done:
            self._plain(self.pass_line())
        self.print_table(self.task_table(best=store.best))
        self.print_table(self.pass_table())
        self.console.print(f"run folder: {escape(str(store.root))} · all statistics: "
                           f"[bold]kernelsearch report {escape(str(store.root))}[/]", highlight=False, soft_wrap=True)
