"""The `kernelsearch` command line. Each command is a thin layer over the packages it drives."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Annotated, Optional

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


@app.command("eval")
def eval_command(
    task_id: Annotated[str, typer.Argument(help="Task id, e.g. level1/19_ReLU or builtin/1_LeakyReLU_Scale.")],
    candidate_file: Annotated[Path, typer.Argument(help="A module defining ModelNew, or a whole model completion.")],
    source: opt.Source = "builtin",
    level: opt.Level = None,
    ids: opt.Ids = None,
    tasks: opt.TaskIds = None,
    max_input_mb: opt.MaxInputMb = None,
    device: opt.Device = "auto",
    backend: Annotated[str, typer.Option("--backend", help="auto, cuda, cpp, triton or torch.")] = "auto",
    allow_torch: Annotated[bool, typer.Option("--allow-torch", help="Accept plain-PyTorch rewrites (spec rule 11 otherwise rejects them).")] = False,
    as_json: opt.Json = False,
) -> None:
    """Build, verify and time one candidate kernel for one task, and print the verdict."""
    from oracle import Oracle, OracleConfig
    from oracle.candidate import BACKENDS

    if backend != "auto" and backend not in BACKENDS:
        fail(f"--backend must be auto or one of {', '.join(BACKENDS)}, not '{backend}'")
    try:
        text = candidate_file.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        fail(f"cannot read {candidate_file}: {exc.strerror}")
    dev = resolve_device(device)
    selected = ",".join(filter(None, [tasks, task_id]))
    result = select_tasks(source, level, ids, selected, max_input_mb, dev)
    task = next((t for t in result.tasks if t.id == task_id), None)
    if task is None:
        fail(f"task {task_id} is not in {source} (see `kernelsearch tasks --source {source}`)")
    oracle = Oracle(OracleConfig(device=dev, allow_torch=allow_torch))
    with err_console.status(f"evaluating {candidate_file.name} on {task_id} ({dev})...", spinner="dots"):
        verdict = oracle.evaluate(task, text, backend)
    if as_json:
        print(json.dumps(verdict.to_json()))
        return
    print_verdict(verdict)


STATUS_STYLE = {"correct": "bold green", "incorrect": "bold red", "compile_error": "bold magenta",
                "runtime_error": "bold red", "timeout": "bold yellow", "rejected": "bold yellow", "no_code": "dim"}


def print_verdict(v) -> None:
    """A verdict for people: status, the feedback message, and the timings that exist."""
    console.print(f"[{STATUS_STYLE.get(v.status, 'bold')}]{v.status}[/]  {v.task}  backend={v.backend}  hash={v.hash}",
                  highlight=False)
    console.print(v.message, highlight=False, markup=False)
    table = Table(show_header=False, box=None)
    rows = [("build", v.build_s, "s", " (cached)" if v.build_cached else ""), ("verify", v.verify_s, "s", ""),
            ("candidate", v.time_ms, "ms", ""), ("eager PyTorch", v.eager_ms, "ms", ""),
            ("torch.compile", v.compile_ms, "ms", ""), ("speedup vs eager", v.speedup_vs_eager, "x", ""),
            ("speedup vs compile", v.speedup_vs_compile, "x", "")]
    for name, value, unit, note in rows:
        if value is not None:
            table.add_row(name, f"{value:.4g} {unit}{note}")
    if v.flags:
        table.add_row("flags", ", ".join(v.flags))
    console.print(table)


@app.command("run")
def run_command(
    out: Annotated[Optional[Path], typer.Option("--out", help="Run folder to create (config.json, samples.jsonl, best/).")] = None,
    generator: Annotated[Optional[str], typer.Option("--generator", help="vllm:MODEL_OR_PATH, openai:URL[#model] or replay:PATH.")] = None,
    strategy: Annotated[str, typer.Option("--strategy", help="Prompt strategy (see `kernelsearch strategies`).")] = "zero-shot",
    n: Annotated[int, typer.Option("-n", min=1, help="Samples (chains) per task.")] = 8,
    rounds: Annotated[int, typer.Option("--rounds", min=1, help="Rounds per chain.")] = 1,
    target_speedup: Annotated[float, typer.Option("--target-speedup", help="Stop a task once a correct kernel is this much faster than eager.")] = 1.0,
    no_early_stop: Annotated[bool, typer.Option("--no-early-stop", help="Spend the whole budget (for studies).")] = False,
    seed: Annotated[int, typer.Option("--seed", help="Run seed: per-sample seeds derive from it.")] = 0,
    ambition: Annotated[str, typer.Option("--ambition", help="agents: conservative (fuse around library GEMM/conv) or full.")] = "conservative",
    kernel_backend: Annotated[str, typer.Option("--kernel-backend", help="What the model is asked to write: cuda, cpp or triton.")] = "cuda",
    gpus: Annotated[Optional[int], typer.Option("--gpus", min=1, help="GPU oracles (default: every GPU the generator does not need; all of them when it must share).")] = None,
    generator_replicas: Annotated[int, typer.Option("--generator-replicas", min=1, help="Data-parallel copies of the generator; samples go to the least busy.")] = 1,
    tensor_parallel_size: Annotated[int, typer.Option("--tensor-parallel-size", min=1, help="GPUs per vLLM replica.")] = 1,
    share_generator: Annotated[bool, typer.Option("--share-generator", help="Pause generation while an oracle times, even where the generator has GPUs of its own.")] = False,
    address: Annotated[Optional[str], typer.Option("--address", help="Join this Ray cluster instead of starting one.")] = None,
    resume: Annotated[Optional[Path], typer.Option("--resume", help="Finish an interrupted run in this folder.")] = None,
    allow_torch: Annotated[bool, typer.Option("--allow-torch", help="Accept plain-PyTorch rewrites.")] = False,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=16, help="Tokens per completion.")] = 4096,
    source: opt.Source = "builtin",
    level: opt.Level = None,
    ids: opt.Ids = None,
    tasks: opt.TaskIds = None,
    max_input_mb: opt.MaxInputMb = None,
    device: opt.Device = "auto",
) -> None:
    """Search: sample n candidates per task, verify and time each, keep the best kernel."""
    import asyncio

    from search.controller import SearchPlan
    from search.generators.base import GeneratorError
    from search.runner import RunSettings, build_engine, make_config, run_search, start_ray
    from search.store import RunStore, StoreError
    from strategies import STRATEGIES
    from tasks.model import Task

    if resume is not None:
        try:
            store = RunStore.open(resume)
        except StoreError as exc:
            fail(str(exc))
        cfg = store.config()
        settings = RunSettings(generator=cfg["generator"], strategy=cfg["strategy"], plan=SearchPlan(**cfg["plan"]),
                               device=cfg["device"], gpus=cfg.get("gpus"), address=address,
                               max_input_mb=cfg.get("max_input_mb"), source=cfg.get("source", "builtin"),
                               allow_torch=cfg.get("allow_torch", False),
                               strategy_backend=cfg.get("strategy_options", {}).get("backend", "cuda"),
                               strategy_options={k: v for k, v in cfg.get("strategy_options", {}).items() if k != "backend"},
                               generator_replicas=cfg.get("generator_replicas", 1),
                               tensor_parallel_size=cfg.get("tensor_parallel_size", 1),
                               share_generator=cfg.get("share_generator", False))
        task_list = [Task.from_json(t) for t in cfg["tasks"]]
        err_console.print(f"resuming {resume}: {len(store.samples())} samples already recorded")
    else:
        if out is None or generator is None:
            fail("--out and --generator are required (or --resume DIR)")
        if strategy not in STRATEGIES:
            fail(f"unknown strategy '{strategy}' (known: {', '.join(STRATEGIES)})")
        if ambition not in ("conservative", "full"):
            fail(f"--ambition must be conservative or full, not '{ambition}'")
        if kernel_backend not in ("cuda", "cpp", "triton"):
            fail(f"--kernel-backend must be cuda, cpp or triton, not '{kernel_backend}'")
        dev = resolve_device(device)
        loaded = select_tasks(source, level, ids, tasks, max_input_mb, dev)
        if not loaded.tasks:
            fail("no tasks selected")
        task_list = loaded.tasks
        plan = SearchPlan(n=n, rounds=rounds, target_speedup=target_speedup, early_stop=not no_early_stop,
                          seed=seed, max_tokens=max_tokens)
        settings = RunSettings(generator=generator, strategy=strategy, plan=plan, device=dev, gpus=gpus, address=address,
                               max_input_mb=max_input_mb, source=source, allow_torch=allow_torch, strategy_backend=kernel_backend,
                               strategy_options={"ambition": ambition} if strategy == "agents" else {},
                               generator_replicas=generator_replicas, tensor_parallel_size=tensor_parallel_size,
                               share_generator=share_generator)
        try:
            from search.generators.spec import parse_generator_spec

            parse_generator_spec(generator)
        except GeneratorError as exc:
            fail(str(exc))
    with err_console.status("starting Ray and the generator...", spinner="dots"):
        try:
            resources = start_ray(settings.address, settings.device)
            engine = asyncio.run(build_engine(settings))
        except (GeneratorError, RuntimeError) as exc:
            fail(str(exc))
    if resume is None:
        try:
            store = RunStore.create(out, make_config(settings, task_list, engine.generator_info, resources))
        except StoreError as exc:
            fail(str(exc))
    from search.progress import RunProgress

    planned = len(task_list) * settings.plan.n * settings.plan.rounds
    with RunProgress(console, task_list, planned, store.samples(), stats=engine.pool.stats,
                     stop_at=settings.plan.target_speedup if settings.plan.early_stop else None) as progress:
        try:
            asyncio.run(progress.run(run_search(settings, task_list, store, progress.record, engine)))
        except KeyboardInterrupt:
            err_console.print(f"interrupted: finish with `kernelsearch run --resume {store.root}`")
            raise typer.Exit(130)
    progress.print_summary(store)


@app.command("report")
def report_command(
    run_dirs: Annotated[list[Path], typer.Argument(help="Run folders (several side by side, e.g. one per strategy).")],
    as_json: opt.Json = False,
    csv: Annotated[Optional[Path], typer.Option("--csv", help="Write per-task rows of every run to this CSV file.")] = None,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="Draw pass@k and fast_1.0@k against k to this PNG (with --by: the budget view).")] = None,
    by: Annotated[Optional[str], typer.Option("--by", help="Also compare runs at equal budget per task: samples, tokens or gpu-seconds.")] = None,
    compare: Annotated[bool, typer.Option("--compare", help="For each pair of runs, the budget at which one overtakes the other (default --by samples).")] = False,
) -> None:
    """Correctness as n grows (pass@k, fast_p@k, expected best speedup) and per-task results, from disk."""
    from search.report import ReportError, report

    try:
        report(run_dirs, console, as_json, csv, plot, by=by, compare=compare)
    except ReportError as exc:
        fail(str(exc))


@app.command("demo")
def demo_command(
    out: Annotated[Optional[Path], typer.Option("--out", help="Run folder to create (default: runs/demo-<time>).")] = None,
    device: opt.Device = "auto",
) -> None:
    """A short search on built-in tasks with recorded completions standing in for a model (no model, no GPU needed)."""
    import time

    from search.demo import DemoError, run_demo

    try:
        run_demo(out or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S"), console, resolve_device(device))
    except DemoError as exc:
        fail(str(exc))


@app.command("strategies")
def strategies_command() -> None:
    """List the prompt strategies, one line each."""
    from strategies import STRATEGIES

    for name, cls in STRATEGIES.items():
        console.print(f"[bold]{name}[/]: {cls.summary}", highlight=False)


from search.cluster import cluster_command  # noqa: E402 - `kernelsearch cluster` lives with the cluster code

app.command("cluster")(cluster_command)


import_app = typer.Typer(help="Turn other harnesses' generations into replay files.", no_args_is_help=True)
app.add_typer(import_app, name="import")


@import_app.command("kernelbench")
def import_kernelbench_command(
    run_dir: Annotated[Path, typer.Argument(help="A KernelBench run folder (level_L_problem_P_sample_S_kernel.py files).")],
    source: Annotated[str, typer.Option("--source", help="The KernelBench checkout or dataset file the run was made for.")],
    out: Annotated[Path, typer.Option("-o", "--out", help="The replay file to write (JSONL).")],
) -> None:
    """Write a KernelBench run's kernels as a replay file, one line a kernel; judge it with
    `kernelsearch run --generator replay:FILE --source SOURCE`."""
    from search.kernelbench_import import import_run, write_replay

    if not run_dir.is_dir():
        fail(f"{run_dir} is not a folder")
    try:
        result = import_run(run_dir, source)
    except SourceError as exc:
        fail(str(exc))
    for path, why in result.skipped:
        err_console.print(f"skipped {path}: {why}", highlight=False, soft_wrap=True)
    if not result.kernels:
        fail(f"no level_L_problem_P_sample_S_kernel.py files of {source}'s tasks under {run_dir}")
    write_replay(result, out)
    console.print(f"{len(result.kernels)} kernel(s) for {len(result.tasks)} task(s) written to {out}; judge them with "
                  f"kernelsearch run --generator replay:{out} --source {source} --tasks {','.join(result.tasks)}",
                  highlight=False, soft_wrap=True)


def main() -> None:  # pragma: no cover - console-script entry for `python -m search.cli`
    sys.exit(app())


if __name__ == "__main__":  # pragma: no cover
    main()
