"""`kernelsearch demo`: a short search on built-in tasks with recorded completions standing in for a model.

No model runs. `demo_data/completions.jsonl` holds completions written the way a code model answers (a
sentence, then a ```python block): per task a fast and a slow correct kernel, a wrong one, one that does not
compile, one that crashes and one that cheats, in C++ for a CPU oracle and in CUDA for a GPU oracle. They go
through the real engine: the replay generator on Ray, the oracle pool (build, check against PyTorch, time),
the run store and the live report, and the demo ends with the tables and the command for a real model.

Per task the variants share one extension source (they differ in the Python around it), so a cold build
cache compiles one extension a task (about 40 s each on an idle 2-core CPU; the compile-error variants
fail on their flags at once). Builds are cached (KERNELSEARCH_CACHE), so a second demo skips them.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

DATA = Path(__file__).resolve().parent / "demo_data" / "completions.jsonl"
DEMO_TASKS = ("builtin/1_LeakyReLU_Scale", "builtin/4_RMSNorm_LastDim", "builtin/5_L2_Normalize_Rows")
VARIANTS = ("fast", "slow", "wrong", "compile_error", "crash", "cheat")
VARIANT_TEXT = {"fast": "correct and fast", "slow": "correct but slow", "wrong": "wrong", "compile_error": "does not compile",
                "crash": "crashes", "cheat": "cheats"}
REAL_MODEL_COMMAND = ("kernelsearch run --generator vllm:Qwen/Qwen2.5-Coder-7B-Instruct --level 1 -n 16 "
                      "--out runs/qwen7b-level1")


class DemoError(Exception):
    """The demo cannot start (the output folder already holds a run, the bundled data is missing)."""


def backend_for(device: str) -> str:
    return "cuda" if device == "cuda" else "cpp"


def _demo_rows(path: Path) -> list[dict[str, Any]]:
    """The lines of a demo completions file (the bundled one, or a demo run's copy of it)."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def demo_completions(device: str, tasks: tuple[str, ...] = DEMO_TASKS, path: Path = DATA) -> list[dict[str, Any]]:
    """The bundled completions this device can run (C++ on a CPU, CUDA on a GPU), for `tasks`."""
    if not path.is_file():
        raise DemoError(f"the demo's completions are missing ({path}); reinstall kernelsearch")
    backend = backend_for(device)
    return [r for r in _demo_rows(path) if r["backend"] == backend and r["task"] in tasks]


def expected_outcomes(run: Path) -> list[dict[str, Any]]:
    """For every sample of a demo run: the variant its completion was written as, the verdict expected and
    the verdict the oracle gave (matched by completion text against the run's replay file)."""
    from search.store import read_samples

    replay = {row["completion"]: row for row in _demo_rows(run / "demo_completions.jsonl")}
    out = []
    for r in read_samples(run / "samples.jsonl"):
        row = replay.get(r.completion, {})
        out.append({"task": r.task, "sample": r.sample_index, "variant": row.get("variant"),
                    "expect": row.get("expect"), "status": r.status, "speedup_vs_eager": r.speedup_vs_eager,
                    "message": r.message})
    order = {v: i for i, v in enumerate(VARIANTS)}
    return sorted(out, key=lambda o: (o["task"], order.get(o["variant"], 99)))


def _headline(message: str) -> str:
    """The line of an oracle message that says what happened (for a compile error, the compiler's error)."""
    lines = [ln.strip() for ln in message.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error:" in ln]
    return (errors[0] if errors and message.startswith("Error building") else lines[0] if lines else "")[:200]


def outcome_table(outcomes: list[dict[str, Any]]) -> Table:
    from oracle.verdict import ratio_text

    table = Table(title="what each recorded completion was written to show, and the oracle's verdict",
                  title_justify="left", caption="verdict in red: not the one the completion was written to get",
                  caption_justify="left")
    for col, width in (("task", 27), ("completion", 16), ("verdict", 13), ("x eager", 7), ("oracle's message", None)):
        table.add_column(col, justify="right" if col == "x eager" else "left", no_wrap=True, overflow="ellipsis",
                         min_width=width, max_width=60 if width is None else None)
    for o in outcomes:
        ok = o["status"] == o["expect"]
        if o["variant"] == "slow" and ok:
            ok = (o["speedup_vs_eager"] or 0) < 1.0
        verdict = f"[green]{o['status']}[/]" if ok else f"[bold red]{o['status']}[/]"
        table.add_row(escape(o["task"]), VARIANT_TEXT.get(o["variant"], "?"), verdict,
                      ratio_text(o['speedup_vs_eager']) if o["status"] == "correct" and o["speedup_vs_eager"] else "-",
                      escape(_headline(o["message"] or "")))
    return table


def run_demo(out: Path, console: Console, device: str = "cpu", address: str | None = None,
             tasks: tuple[str, ...] = DEMO_TASKS) -> Path:
    """Run the demo into the run folder `out` (created; it must not hold a run) on `device` ("cpu" or
    "cuda"), showing the live report on `console`; returns `out`. Raises DemoError if it cannot start."""
    from search.controller import SearchPlan
    from search.progress import RunProgress
    from search.runner import RunSettings, build_engine, make_config, run_search, start_ray
    from search.store import RunStore, StoreError
    from tasks import Selection, load_tasks
    from tasks.fitting import default_budget_mb

    out = Path(out)
    if (out / "config.json").exists() or (out / "samples.jsonl").exists():
        raise DemoError(f"{out} already holds a run: give the demo another --out")
    rows = demo_completions(device, tasks)
    loaded = load_tasks("builtin", Selection(task_ids=frozenset(tasks)), default_budget_mb(device))
    task_list = [t for t in loaded.tasks if t.id in tasks]
    if len(task_list) != len(tasks) or not rows:
        raise DemoError(f"the demo's tasks did not load: {[e.reason for e in loaded.errors] or 'no completions'}")
    per_task = {t: sum(1 for r in rows if r["task"] == t) for t in tasks}
    n = max(per_task.values())  # every recorded completion of a task is drawn exactly once
    backend = backend_for(device)

    console.print(Panel.fit(
        f"[bold]kernelsearch demo[/] · [bold yellow]no model is used[/]\n"
        f"{len(rows)} recorded completions for {len(task_list)} built-in tasks stand in for a model: per task a "
        f"fast and a slow correct {'CUDA' if backend == 'cuda' else 'C++'} kernel, a wrong one, one that does not "
        f"compile, one that crashes and one that cheats. They go through the real engine on this machine "
        f"({device}): Ray, the oracle (build, check against PyTorch, time), the run store and the live report.",
        border_style="yellow", width=min(console.width, 110)), highlight=False)  # prose wraps, in a log too

    out.mkdir(parents=True, exist_ok=True)
    replay = out / "demo_completions.jsonl"
    replay.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    plan = SearchPlan(n=n, rounds=1, early_stop=False, seed=0)  # --no-early-stop: every variant is judged
    settings = RunSettings(generator=f"replay:{replay}", strategy="zero-shot", plan=plan, device=device,
                           address=address, source="builtin", strategy_backend=backend)
    t0 = time.perf_counter()
    with console.status("starting Ray and the oracle...", spinner="dots"):
        resources = start_ray(address, device)
        engine = asyncio.run(build_engine(settings))
    try:
        store = RunStore.create(out, {**make_config(settings, task_list, engine.generator_info, resources), "demo": True})
    except StoreError as exc:
        raise DemoError(str(exc)) from None
    planned = len(task_list) * n
    with RunProgress(console, task_list, planned, [], stats=engine.pool.stats,
                     title="kernelsearch demo · recorded completions, no model") as progress:
        asyncio.run(progress.run(run_search(settings, task_list, store, progress.record, engine)))
    progress.print_summary(store)
    progress.print_table(outcome_table(expected_outcomes(out)))
    # plain lines, not a panel: the commands stay whole (copy-pasteable) at any width
    for line in (f"[bold green]Done in {time.perf_counter() - t0:.0f} s.[/] [bold yellow]No model was used[/]: the "
                 f"samples were the bundled recorded completions.",
                 f"All statistics of this run:  [bold]kernelsearch report {escape(str(out))}[/]  "
                 f"(add --json, --plot pass.png)",
                 "Search with a real model (a GPU machine with vLLM):",
                 f"  [bold]{escape(REAL_MODEL_COMMAND)}[/]",
                 "On a CPU, add [bold]--kernel-backend cpp --device cpu[/] (slow, but the same engine)."):
        console.print(line, highlight=False, soft_wrap=True)
    return out


def main(argv: list[str] | None = None) -> int:
    """`python -m search.demo [--out DIR] [--device auto|cpu|cuda]` (what `kernelsearch demo` runs)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m search.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="run folder to create (default: runs/demo-<time>)")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    args = parser.parse_args(argv)
    from search.devices import resolve_device
    from search.terminal import make_console

    try:
        device = resolve_device(args.device)
        run_demo(args.out or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S"), make_console(), device)
    except (DemoError, ValueError) as exc:
        make_console(stderr=True).print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
