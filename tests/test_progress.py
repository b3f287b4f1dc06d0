"""The live report (search.progress.RunProgress): plain lines without control codes when the output is
not a terminal, and on a terminal a renderable with the progress line, the per-task table and pass@k."""

from __future__ import annotations

import asyncio
import io
import re
from types import SimpleNamespace

from rich.console import Console

from oracle.verdict import Verdict
from search.progress import RunProgress, fmt_duration
from search.stats import pass_at_k
from search.store import SampleRecord

ANSI = re.compile(r"\x1b|\x9b|\r")
TASKS = [SimpleNamespace(id="builtin/1_LeakyReLU_Scale", level=1), SimpleNamespace(id="builtin/4_RMSNorm_LastDim", level=1)]


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def rec(task: str, number: int, status: str, speedup: float | None = None, duplicate_of: int | None = None) -> SampleRecord:
    verdict = Verdict(task, status, "", time_ms=1.0 if status == "correct" else None, speedup_vs_eager=speedup)
    return SampleRecord(task, "zero-shot", round=0, chain=number, sample_index=number, seed=number, status=status,
                        verdict=verdict, duplicate_of=duplicate_of)


# task 0: wrong, correct (1.5x), correct (0.5x), compile error; task 1: wrong, rejected, runtime error, correct (2x)
SAMPLES = [rec(TASKS[0].id, 0, "incorrect"), rec(TASKS[1].id, 0, "incorrect"), rec(TASKS[0].id, 1, "correct", 1.5),
           rec(TASKS[1].id, 1, "rejected"), rec(TASKS[0].id, 2, "correct", 0.5), rec(TASKS[1].id, 2, "runtime_error"),
           rec(TASKS[0].id, 3, "compile_error"), rec(TASKS[1].id, 3, "correct", 2.0, duplicate_of=None)]


def feed(progress: RunProgress, clock: Clock, samples=SAMPLES) -> None:
    for r in samples:
        clock.t += 15.0  # 4 samples a minute
        progress.record(r)


def test_plain_output_has_no_control_codes_and_prints_pass_at_k_lines():
    buf = io.StringIO()
    console = Console(file=buf, width=100)  # not a terminal: a log file, CI
    assert not console.is_terminal
    clock = Clock()
    progress = RunProgress(console, TASKS, 8, [], every=4, clock=clock)

    async def pool_stats():
        return [{"building": 1, "timing": 1, "queued": 2}]

    progress.stats_fn = pool_stats
    asyncio.run(progress.poll_stats())
    with progress:
        feed(progress, clock)
    progress.print_summary(SimpleNamespace(root="runs/x", best=lambda task: None))
    text = buf.getvalue()
    assert not ANSI.search(text), "plain output must carry no control codes"
    lines = text.splitlines()
    assert lines[0] == "8 samples planned over 2 tasks"
    # one line a sample, numbered, with the speedup of correct ones
    sample_lines = [ln for ln in lines if ln.startswith("[")]
    assert len(sample_lines) == 8
    assert sample_lines[2] == "[3/8] builtin/1_LeakyReLU_Scale sample #2: correct 1.50x eager"
    assert any(ln.startswith("  first correct kernel for builtin/4_RMSNorm_LastDim at sample #4") for ln in lines)
    # a pass@k line every 4 samples (after 4 and after 8; the summary does not repeat the last one)
    pass_lines = [ln for ln in lines if ln.startswith("pass@k over")]
    assert len(pass_lines) == 2
    # after 4 samples: task 0 has n=2, c=1; task 1 has n=2, c=0 -> pass@1 = 0.25, pass@2 = 0.5
    assert pass_lines[0].startswith("pass@k over 2 tasks: k=1 0.250 k=2 0.500 | fast_1.0@2 0.500 | 4/8 samples")
    final1 = (pass_at_k(4, 2, 1) + pass_at_k(4, 1, 1)) / 2
    final4 = 1.0
    assert f"k=1 {final1:.3f}" in pass_lines[1] and f"k=4 {final4:.3f}" in pass_lines[1]
    assert "8/8 samples, 4.0 samples/min, elapsed 2:00, ETA 0:00" in pass_lines[1]
    assert "oracles 1: on the device 1/1, building 1, builds queued 2" in pass_lines[1]
    # the summary tables follow, still without control codes
    assert "1st ok" in text and "fast_1.0@k" in text and "kernelsearch report runs/x" in text


def test_terminal_renderable_has_progress_task_table_and_pass_at_k_row():
    console = Console(record=True, force_terminal=True, width=120)
    clock = Clock()
    progress = RunProgress(console, TASKS + [SimpleNamespace(id="builtin/5_L2_Normalize_Rows", level=1)], 12, [],
                           clock=clock)
    progress.pool = [{"building": 1, "timing": 0, "queued": 3}]
    feed(progress, clock, SAMPLES[:6])  # outside `with`: nothing is drawn, the figures still add up
    console.print(progress.renderable())
    text = console.export_text()
    # progress: done of planned, rate, elapsed, ETA, oracle slots
    assert "6/12 (50%)" in text and "4.0 samples/min" in text and "elapsed 1:30" in text and "ETA 1:30" in text
    assert "oracles 1: on the device 0/1, building 1, builds queued 3" in text
    # the per-task table
    assert "1st ok" in text and "x eager" in text
    leaky = next(ln for ln in text.splitlines() if "builtin/1_LeakyReLU_Scale" in ln)
    assert "running" in leaky and "3/4" in leaky and "2 ok, 1 wrong" in leaky and "1.50x" in leaky
    assert "#2" in leaky  # first correct at sample #2
    waiting = next(ln for ln in text.splitlines() if "builtin/5_L2_Normalize_Rows" in ln)
    assert "waiting" in waiting
    # the pass@k rows: k = 1, 2 (each sampled task has 3 samples; powers of two up to n, and n)
    k_row = next(ln for ln in text.splitlines() if ln.startswith("┃ k "))
    assert k_row.split("┃")[2:5] == [f"     {k} " for k in (1, 2, 3)]
    pass_row = next(ln for ln in text.splitlines() if ln.startswith("│ pass@k "))
    expected = [(pass_at_k(3, 2, k) + pass_at_k(3, 0, k)) / 2 for k in (1, 2, 3)]
    for value in expected:
        assert f"{value:.3f}" in pass_row
    assert "fast_1.0@k" in text


def test_task_table_is_capped_with_a_summary_line():
    console = Console(record=True, force_terminal=True, width=120)
    tasks = [SimpleNamespace(id=f"level1/{i}_T", level=1) for i in range(30)]
    progress = RunProgress(console, tasks, 60, [], max_rows=5)
    progress.record(rec("level1/7_T", 0, "correct", 1.2))
    console.print(progress.renderable())
    text = console.export_text()
    assert "level1/7_T" in text  # the running task is among those shown
    assert "... and 25 more tasks: 25 waiting" in text


def test_plain_pass_line_says_over_how_many_tasks_a_k_is_taken():
    buf = io.StringIO()
    progress = RunProgress(Console(file=buf), TASKS, 8, [], every=3)
    for r in SAMPLES[:2] + [SAMPLES[2]]:  # task 0 has 2 samples, task 1 has 1
        progress.record(r)
    line = [ln for ln in buf.getvalue().splitlines() if ln.startswith("pass@k")][-1]
    assert line.startswith("pass@k over 2 tasks: k=1 0.250 k=2 1.000 (1/2 tasks) |")


def test_resume_counts_recorded_samples_but_not_in_the_rate():
    buf = io.StringIO()
    clock = Clock()
    progress = RunProgress(Console(file=buf), TASKS, 8, SAMPLES[:4], every=100, clock=clock)
    assert progress.done == 4 and progress.rate_per_min() is None and progress.eta_s() is None
    feed(progress, clock, SAMPLES[4:6])
    assert progress.rate_per_min() == 4.0 and progress.eta_s() == 30.0
    assert fmt_duration(3725) == "1:02:05" and fmt_duration(None) == "-"


def test_run_polls_the_pool_stats_while_the_search_runs():
    polls = []

    async def stats():
        polls.append(1)
        return [{"building": 0, "timing": 1, "queued": 0, "device_slots": 4}, {"dead": True}]

    async def search():
        await asyncio.sleep(0.25)
        return "done"

    progress = RunProgress(Console(file=io.StringIO()), TASKS, 4, [], stats=stats, poll_s=0.05)
    assert asyncio.run(progress.run(search())) == "done"
    assert len(polls) >= 3
    assert progress.pool_text() == "oracles 2: on the device 1/4, building 0, builds queued 0, 1 restarting"


def test_early_stopped_task_shows_as_solved():
    console = Console(record=True, force_terminal=True, width=120)
    progress = RunProgress(console, TASKS, 8, [], stop_at=1.0)
    progress.record(rec(TASKS[0].id, 0, "correct", 1.5))
    progress.record(rec(TASKS[1].id, 0, "correct", 0.5))
    assert progress.task_status(TASKS[0].id) == "solved" and progress.task_status(TASKS[1].id) == "running"


def test_counts_read_as_words_and_long_ids_are_never_cut():
    buf = io.StringIO()
    long_id = "level2/2_ConvTranspose2d_BiasAdd_Clamp_Scaling_Clamp_Divide"
    progress = RunProgress(Console(file=buf, width=100), [SimpleNamespace(id=long_id, level=2)], 1, [], every=1)
    with progress:
        progress.record(rec(long_id, 0, "unsupported"))
    lines = buf.getvalue().splitlines()
    assert lines[0] == "1 sample planned over 1 task"
    assert lines[1] == f"[1/1] {long_id} sample #1: unsupported"
    console = Console(record=True, force_terminal=True, width=100)  # the live table: the id folds, whole
    console.print(progress.task_table())
    text = console.export_text()
    assert "…" not in text and "1 unsupported" in text
    assert long_id in "".join(ln.split("│")[1].strip() for ln in text.splitlines() if ln.startswith("│"))


def test_the_pool_line_says_where_the_device_time_went():
    progress = RunProgress(Console(file=io.StringIO()), TASKS, 4, [])
    progress.pool = [{"timing": 1, "device_slots": 4, "device_phases_s": {"checks": 12.4, "timing": 3.0, "reference": 0.0}},
                     {"timing": 0, "device_slots": 4, "device_phases_s": {"checks": 2.0, "baselines": 1.6}}]
    assert progress.pool_text() == ("oracles 2: on the device 1/8, building 0, builds queued 0; "
                                    "device s: checks 14, timing 3, baselines 2")
    progress.pool[0]["device_waiting"] = 3  # built, waiting for a device slot
    assert progress.pool_text().startswith("oracles 2: on the device 1/8 (3 waiting), building 0,")


def test_a_sample_recorded_again_with_its_compile_baseline_replaces_its_first_record():
    """A correct sample comes first without its task's torch.compile speedup, then again with it: the live
    figures take the second in the first's place, and count the sample once."""
    clock = Clock()
    progress = RunProgress(Console(file=io.StringIO(), width=100), TASKS, 8, [], every=100, clock=clock)
    feed(progress, clock, SAMPLES[:3])
    t = progress.stats[TASKS[0].id]
    assert (progress.done, t.samples, t.correct, t.best_sample_speedup_vs_compile) == (3, 2, 1, None)
    again = rec(TASKS[0].id, 1, "correct", 1.5)
    again.verdict.speedup_vs_compile = 0.8
    progress.record(again)
    t = progress.stats[TASKS[0].id]
    assert (progress.done, t.samples, t.correct, t.best_sample_speedup_vs_compile) == (3, 2, 1, 0.8)
    assert progress.by_task[TASKS[0].id][1] is again
