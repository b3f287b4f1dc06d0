"""The `kernelsearch` command line. Each command is a thin layer over the packages it drives.

Every user error is one line on stderr (`error: ...`), those of the flags included: `App` turns click's usage
errors into that line instead of the framework's box. Output that is not a terminal is drawn at its natural
width (`search.terminal`), so ids and numbers are never cut.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any, Callable, Optional, TypeVar

import typer
from rich.markup import escape
from rich.table import Table

from oracle.paths import DEFAULT_CACHE
from search.bytecode import keep_bytecode

keep_bytecode(DEFAULT_CACHE)  # before torch and Ray are imported, here and in every process a run starts

from search import options as opt  # this and what follows import torch
from search.devices import resolve_device as _resolve_device
from search.terminal import add_id_column, make_console
from search.words import plural
from tasks import LoadResult, Selected, Selection, SelectionError, SourceError, fit_selected, read_selected
from tasks.fitting import default_budget_mb

PROG = "kernelsearch"
# click's exceptions as this typer raises them (recent typers carry a copy of click of their own)
_errors = sys.modules[typer.BadParameter.__module__]
_NO_ARGS = getattr(_errors, "NoArgsIsHelpError", ())


class App(typer.Typer):
    """A Typer app whose usage errors (a bad flag value, an unknown option) are one `error:` line like every
    other user error, with the command's --help named, and whose exit status is returned, not raised."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("prog_name", PROG)
        try:
            return super().__call__(*args, standalone_mode=False, **kwargs)
        except _NO_ARGS as exc:
            print(exc.format_message())
            return 0
        except _errors.UsageError as exc:
            where = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
            message = " ".join(exc.format_message().split())
            err_console.print(f"[bold red]error:[/] {escape(message)}{escape(where)}", highlight=False, soft_wrap=True)
            return exc.exit_code
        except _errors.ClickException as exc:
            err_console.print(f"[bold red]error:[/] {escape(' '.join(exc.format_message().split()))}",
                              highlight=False, soft_wrap=True)
            return exc.exit_code
        except (typer.Abort, _errors.Abort):
            err_console.print("aborted", highlight=False)
            return 1


app = App(
    help="Best-of-n search for fast, verified GPU kernels from small local code models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: option texts such as openai:URL[#model] are not read as markup
)
console = make_console()
err_console = make_console(stderr=True)


def version() -> str:
    try:
        return metadata.version("kernelsearch")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def _print_version(value: bool) -> None:
    if value:
        print(f"{PROG} {version()}")
        raise typer.Exit()


@app.callback()
def _root(
    _version: Annotated[Optional[bool], typer.Option("--version", callback=_print_version, is_eager=True,
                                                     help="Print the version and exit.")] = None,
) -> None:
    """Best-of-n search for fast, verified GPU kernels from small local code models."""


T = TypeVar("T")


def timed(fn: Callable[..., T], *args: Any, **kwargs: Any) -> tuple[T, float]:
    """`fn`'s result and the seconds it took (rounded to 10 ms)."""
    began = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, round(time.perf_counter() - began, 2)


def fail(message: str, code: int = 2) -> None:
    """A user error: one line on stderr, no traceback."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def resolve_device(device: str) -> str:
    try:
        return _resolve_device(device)
    except ValueError as exc:
        fail(str(exc))


def select_tasks(source: str, level: int | None, ids: str | None, tasks: str | None, max_input_mb: float | None,
                 device: str, warn_unknown: bool = True) -> LoadResult:
    """Load the selected tasks fitted to the budget; report malformed ones and go on. `warn_unknown`: say
    which asked-for task ids the source lacks (a caller that fails on them says it itself)."""
    return fit_tasks(read_tasks(source, level, ids, tasks, warn_unknown), max_input_mb, device)


def read_tasks(source: str, level: int | None, ids: str | None, tasks: str | None, warn_unknown: bool = True) -> Selected:
    """The selected tasks as written (quick: nothing runs), or one line for a bad selection or source."""
    try:
        selection = Selection.from_flags(level, ids, tasks)
        selected = read_selected(source, selection)
    except (SelectionError, SourceError) as exc:
        fail(str(exc))
    if selection.task_ids and warn_unknown:
        for task_id in sorted(selection.task_ids - {r.id for r in selected.raws}):
            err_console.print(f"[yellow]unknown task[/] {escape(task_id)} in {escape(source)}", highlight=False)
    return selected


def fit_tasks(selected: Selected, max_input_mb: float | None, device: str, spinner: bool = True) -> LoadResult:
    """`read_tasks`'s tasks fitted to the budget, each malformed one named. `spinner` False: the caller shows its
    own (one live display at a time)."""
    budget = max_input_mb if max_input_mb is not None else default_budget_mb(device)
    with err_console.status("loading tasks...", spinner="dots") if spinner else contextlib.nullcontext():
        result = fit_selected(selected, budget)
    for error in result.errors:
        err_console.print(f"[yellow]skipped[/] {escape(error.id)}: {escape(error.reason)}", highlight=False, soft_wrap=True)
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
    table = Table(title=escape(f"{plural(len(result.tasks), 'task')} from {source}"))
    # an id is pasted into --tasks: whole on one line where it fits beside the other columns, else folded
    add_id_column(table, "id", [t.id for t in result.tasks], room=console.width - 45)
    for col in ("level", "problem", "input MB", "fitted from"):
        table.add_column(col, justify="right" if col in ("level", "problem", "input MB") else "left")
    for t in result.tasks:
        fitted = ", ".join(f"{k} {v}->{t.sizes[k]}" for k, v in t.original_sizes.items())
        table.add_row(escape(t.id), str(t.level), str(t.problem_id), f"{t.input_mb:.1f}", fitted or "-")
    console.print(table)
    if result.errors:
        err_console.print(f"{plural(len(result.errors), 'task')} skipped (reasons above)")


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
    allow_torch: Annotated[bool, typer.Option("--allow-torch", help="Accept plain-PyTorch rewrites (otherwise rejected: the candidate must run a kernel of its own).")] = False,
    tolerance: opt.Tolerance = "kernelbench",
    as_json: opt.Json = False,
) -> None:
    """Build, verify and time one candidate kernel for one task, and print the verdict."""
    from oracle import Oracle, OracleConfig
    from oracle.candidate import BACKENDS

    if backend != "auto" and backend not in BACKENDS:
        fail(f"--backend must be auto or one of {', '.join(BACKENDS)}, not '{backend}'")
    check_tolerance(tolerance)
    try:
        text = candidate_file.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        fail(f"cannot read {candidate_file}: {exc.strerror}")
    dev = resolve_device(device)
    selected = ",".join(filter(None, [tasks, task_id]))
    result = select_tasks(source, level, ids, selected, max_input_mb, dev, warn_unknown=False)
    task = next((t for t in result.tasks if t.id == task_id), None)
    if task is None:
        fail(f"task {task_id} is not in {source} (see `kernelsearch tasks --source {source}`)")
    oracle = Oracle(OracleConfig(device=dev, allow_torch=allow_torch, tolerance=tolerance))
    with err_console.status(escape(f"evaluating {candidate_file.name} on {task_id} ({dev})..."), spinner="dots"):
        verdict = oracle.evaluate(task, text, backend)
    if as_json:
        print(json.dumps(verdict.to_json()))
        return
    print_verdict(verdict)


def print_verdict(v) -> None:
    """A verdict for people: status, the feedback message, and the timings that exist."""
    from oracle.verdict import STYLES

    console.print(f"[bold {STYLES.get(v.status, '')}]{v.status}[/]  {escape(v.task)}  backend={v.backend}  hash={v.hash}",
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
    if v.errors is not None:
        e = v.errors
        table.add_row("max error", f"{e.max_abs:.3g} abs, {e.max_rel:.3g} rel")
        if e.rel_l2_64 is not None:
            table.add_row("vs float64", f"{e.rel_l2_64:.3g} rel L2 (the float32 reference's own: {e.ref32_rel_l2_64:.3g})")
        elif e.float64:
            table.add_row("vs float64", e.float64)
    table.add_row("tolerance", f"{v.tolerance}; passes: {', '.join(v.passes) or 'none'}")
    if v.flags:
        table.add_row("flags", ", ".join(v.flags))
    console.print(table)


def check_tolerance(name: str) -> str:
    from oracle.tolerance import POLICIES

    if name not in POLICIES:
        fail(f"--tolerance must be one of {', '.join(POLICIES)}, not '{name}'")
    return name


@app.command("run")
def run_command(
    out: Annotated[Optional[Path], typer.Option("--out", help="Run folder to create (config.json, samples.jsonl, best/).")] = None,
    generator: Annotated[Optional[str], typer.Option("--generator", help="vllm:MODEL_OR_PATH, openai:URL[#model] or replay:PATH (replay: the tasks the file names, unless tasks are selected).")] = None,
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
    tolerance: opt.Tolerance = "kernelbench",
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

    startup_s: dict[str, float] = {}  # what this invocation spent before the search began (config.json)
    if resume is not None:
        try:
            store = RunStore.open(resume)
            recorded = store.samples()
            cfg = store.config()
            settings = RunSettings.from_json(cfg, address=address)
        except StoreError as exc:
            fail(str(exc))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            fail(f"{resume / 'config.json'} cannot be resumed ({type(exc).__name__}: {exc})")
        check_generator(settings.generator)
        task_list = [Task.from_json(t) for t in cfg["tasks"]]
        loading = None
        err_console.print(f"resuming {escape(str(resume))}: {plural(len(recorded), 'sample')} already recorded",
                          highlight=False)
    else:
        if out is None or generator is None:
            fail("--out and --generator are required (or --resume DIR)")
        if strategy not in STRATEGIES:
            fail(f"unknown strategy '{strategy}' (known: {', '.join(STRATEGIES)})")
        if ambition not in ("conservative", "full"):
            fail(f"--ambition must be conservative or full, not '{ambition}'")
        if kernel_backend not in ("cuda", "cpp", "triton"):
            fail(f"--kernel-backend must be cuda, cpp or triton, not '{kernel_backend}'")
        check_tolerance(tolerance)
        named = check_generator(generator)
        dev = resolve_device(device)
        if named is not None and level is None and ids is None and tasks is None:
            tasks = ",".join(named)
            err_console.print(f"tasks: the {plural(len(named), 'task')} that {escape(generator)} names "
                              "(select others with --tasks, --level or --ids)", highlight=False, soft_wrap=True)
        # the tasks are read here (a bad source or selection fails at once) and fitted in a thread beside Ray's
        # start (seconds each where torch imports slowly); Ray starts on this thread, to which its client is bound
        selected = read_tasks(source, level, ids, tasks)
        if not selected.raws:
            fail("no tasks selected")
        loader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tasks")
        loading = loader.submit(timed, fit_tasks, selected, max_input_mb, dev, spinner=False)
        loader.shutdown(wait=False)
        plan = SearchPlan(n=n, rounds=rounds, target_speedup=target_speedup, early_stop=not no_early_stop,
                          seed=seed, max_tokens=max_tokens)
        settings = RunSettings(generator=generator, strategy=strategy, plan=plan, device=dev, gpus=gpus, address=address,
                               max_input_mb=max_input_mb, source=source, allow_torch=allow_torch, tolerance=tolerance,
                               strategy_backend=kernel_backend,
                               strategy_options={"ambition": ambition} if strategy == "agents" else {},
                               generator_replicas=generator_replicas, tensor_parallel_size=tensor_parallel_size,
                               share_generator=share_generator)
        recorded = []
    starting = "starting Ray and the generator..."
    with err_console.status(starting if loading is None else f"loading tasks, {starting}", spinner="dots"):
        try:
            began = time.perf_counter()
            resources = start_ray(settings.address, settings.device)
            startup_s["ray"] = round(time.perf_counter() - began, 2)  # beside the tasks' loading (its own seconds)
        except RuntimeError as exc:
            fail(str(exc))
        if loading is not None:  # before the generator starts: a bad selection fails without loading a model
            loaded, startup_s["tasks"] = loading.result()
            if not loaded.tasks:
                fail("no tasks selected")
            task_list = loaded.tasks
        try:
            began = time.perf_counter()
            engine = asyncio.run(build_engine(settings))
            startup_s["engine"] = round(time.perf_counter() - began, 2)
        except (GeneratorError, RuntimeError) as exc:
            fail(str(exc))
    if resume is None:
        try:
            store = RunStore.create(out, {**make_config(settings, task_list, engine.generator_info, resources),
                                          "startup_s": startup_s})
        except StoreError as exc:
            fail(str(exc))
    from search.progress import RunProgress

    planned = len(task_list) * settings.plan.n * settings.plan.rounds
    with RunProgress(console, task_list, planned, recorded, stats=engine.pool.stats,
                     stop_at=settings.plan.target_speedup if settings.plan.early_stop else None) as progress:
        try:
            asyncio.run(progress.run(run_search(settings, task_list, store, progress.record, engine)))
        except KeyboardInterrupt:
            err_console.print(f"interrupted: finish with `kernelsearch run --resume {escape(str(store.root))}`",
                              highlight=False)
            raise typer.Exit(130)
    progress.print_summary(store)


def check_generator(spec: str) -> list[str] | None:
    """Check a generator spec, and a replay file's lines, before anything starts: a bad spec or a missing file
    fails here in one line, a bad line is named and skipped. Returns the task ids a replay file names."""
    from search.generators.base import GeneratorError
    from search.generators.spec import parse_generator_spec

    try:
        kind, args = parse_generator_spec(spec)
        if kind != "replay":
            return None
        from search.generators.replay import read_replay

        replay = read_replay(args["path"])
    except GeneratorError as exc:
        fail(str(exc))
    for line in replay.skipped:
        err_console.print(f"[yellow]replay[/] {escape(str(replay.path))}: {escape(line)}", highlight=False, soft_wrap=True)
    return replay.tasks


@app.command("report")
def report_command(
    run_dirs: Annotated[list[Path], typer.Argument(help="Run folders (several side by side, e.g. one per strategy).")],
    as_json: opt.Json = False,
    csv: Annotated[Optional[Path], typer.Option("--csv", help="Write per-task rows of every run to this CSV file.")] = None,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="Draw pass@k and fast_1.0@k against k to this PNG (with --by: the budget view).")] = None,
    by: Annotated[Optional[str], typer.Option("--by", help="Also compare runs at equal budget per task: samples, tokens or gpu-seconds.")] = None,
    compare: Annotated[bool, typer.Option("--compare", help="For each pair of runs, the budget at which one overtakes the other (default --by samples).")] = False,
    tolerance: Annotated[Optional[str], typer.Option("--tolerance", help="Count correct under this tolerance policy instead of the run's own (from the verdicts' recorded figures; nothing is re-run).")] = None,
) -> None:
    """Correctness as n grows (pass@k, fast_p@k, expected best speedup) and per-task results, from disk.
    With --json, stdout is the JSON object alone."""
    from search.report import ReportError, report

    try:
        if tolerance is not None:
            check_tolerance(tolerance)
        report(run_dirs, console, as_json, csv, plot, by=by, compare=compare, notes=err_console, tolerance=tolerance)
    except ReportError as exc:
        fail(str(exc))


@app.command("demo")
def demo_command(
    out: Annotated[Optional[Path], typer.Option("--out", help="Run folder to create (default: runs/demo-<time>).")] = None,
    device: opt.Device = "auto",
) -> None:
    """A short search on built-in tasks with recorded completions standing in for a model (no model, no GPU needed)."""
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
