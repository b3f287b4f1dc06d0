"""Timing fidelity: is kernelsearch's clock right on a busy machine, and does it repeat?

    python benchmarks/fidelity.py [--device cuda|cpu] [--tasks ID,...|--all] [--timings 2] [--storm N]
                                  [--compilers asis,stop,reserve] [--launch-bound TASK] [--launch-bound-mb 0.0625]
                                  [--rival TASK] [--rivals 1] [--skip eager,launch,rival] [--budget-s 290]
                                  [--cache DIR] [--out FILE.json]

Every correct candidate under `benchmarks/candidates/` of the selected tasks (CUDA on a GPU, `*_cpp.py` on
a CPU) is timed two ways:

1. the yardstick: a minimal event timer of its own (benchmarks/event_timer.py: fixed inputs, L2 flushed,
   the lowest of three rounds' medians of 100 calls), in a fresh process on a quiet machine, after every
   build is done;
2. kernelsearch: `Oracle.check_and_time`, `--timings` times, each in a fresh worker process, while
   `--storm` cold builds run beside it (default: one per core but one, as 15 nvcc builds held 16 cores
   when launch-bound kernels measured 2-10x slow). The builds go through the same oracle, so what it does
   with its compilers while it times is what `asis` measures; `--compilers` adds passes where this script
   stops the builds for each timing (`stop`) or keeps them off the cores `oracle.cores.plan_cores()` keeps
   for timing, at a lower priority (`reserve`), each with the builds it completed a minute: its cost
   (the builds: benchmarks/build_storm.py).

A row passes when kernelsearch's median is within 5% (or 2 us) of the yardstick, and its fresh-process
timings within 2% of each other. Besides the candidates:
- `eager`: each task's own reference submitted as a candidate, with its baseline re-timed in the same
  evaluation: the ratio must be 1.00 within the two timings' spread (interquartile range over median);
  its time is compared with the yardstick's time of the reference too;
- `launch-bound`: a level-2 GEMM epilogue fitted to tiny inputs (`--launch-bound-mb`), a few
  microseconds of GPU work per call, timed first, with the builds running;
- `second process`: `--rivals` other kernelsearch processes on the same device time `--rival`'s eager
  baseline in a loop while this one times a candidate (no builds): the contention a machine-wide lock
  prevents. The row says how many of the rivals' timings fell inside its own.

Rows print as they finish; a short table ends the run. `--budget-s` starts no new row past it (keeping a
minute for the second process); the default selection takes about 5 minutes on one H200 from a cold cache.
`--compilers asis,stop,reserve --skip eager,rival --budget-s 540` compares the three ways in one run;
`--compilers asis,unplaced --tasks level1/19_ReLU --skip rival` prices the move of the timing process onto
the kept cores (launch-bound rows first in each pass).
`--all` takes every task of the corpus with a correct candidate: well over 10 minutes, split it with
`--tasks` across runs that share `--cache`. On a CPU (`--device cpu`) the same runs with the `*_cpp.py`
candidates, e.g. `--device cpu --tasks level1/19_ReLU --max-input-mb 16 --storm 1` (about 2 minutes on
2 cores); there the oracle itself stops its builds while it times.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

from oracle import Oracle, OracleConfig, Verdict  # noqa: E402
from oracle.candidate import Candidate  # noqa: E402
from oracle.evaluate import BuildOutcome  # noqa: E402
from tasks import Selection, load_tasks  # noqa: E402
from tasks.model import Task  # noqa: E402

from build_storm import Storm, compilers_running, compilers_stopped  # noqa: E402  (benchmarks/)

DATA = [ROOT.parent / ".shared" / "kernelbench" / "kernelbench_levels1-3.jsonl",
        ROOT.parent.parent / "shared" / "kernelbench" / "kernelbench_levels1-3.jsonl"]
DEFAULT_TASKS = ["level1/19_ReLU", "level1/23_Softmax", "level1/47_Sum_reduction_over_a_dimension",
                 "level2/76_Gemm_Add_ReLU"]
LAUNCH_BOUND = {"cuda": "level2/76_Gemm_Add_ReLU", "cpu": "level1/19_ReLU"}
RIVAL = {"cuda": ("level2/76_Gemm_Add_ReLU", "level2/12_Gemm_Multiply_LeakyReLU"),  # (timed here, timed by rivals)
         "cpu": ("level1/19_ReLU", "level1/23_Softmax")}
TOLERANCE, TOLERANCE_MS, REPEAT_TOLERANCE = 0.05, 0.002, 0.02


@dataclass
class Case:
    """One thing to time: a candidate (or the task's own reference, for `eager`) for one fitted task."""

    kind: str  # kernel, eager, launch-bound, second process
    task: Task
    variant: str  # the candidate file's stem, or "eager"
    path: Path | None  # the candidate file (None: the reference itself)
    tag: str = ""  # told apart from the same candidate at another size
    candidate: Candidate | Verdict | None = None
    build: BuildOutcome | None = None

    @property
    def name(self) -> str:
        return f"{self.task.id}/{self.variant}{self.tag}"

    @property
    def key(self) -> str:
        """What the event timer times: this file (or the reference) at these sizes."""
        return f"{self.task.id}/{self.variant}@{hashlib.sha1(self.task.code.encode()).hexdigest()[:10]}"


@dataclass
class Row:
    """A finished case: the yardstick's time, kernelsearch's fresh-process times, and what they say."""

    kind: str
    name: str
    sizes: dict
    yardstick_ms: float | None
    handling: str = "-"  # what was done about the builds while timing (Storm): asis, stop, reserve, unplaced; "-": none ran
    kernelsearch_ms: list[float] = field(default_factory=list)
    baseline_ms: float | None = None  # eager rows: kernelsearch's eager baseline, re-timed in the same evaluation
    spreads: list[float] = field(default_factory=list)  # eager rows: IQR/median of the candidate's and baseline's timings
    compilers: list[int] = field(default_factory=list)  # compiler processes running as each timing started
    rival_timings: int | None = None  # second-process rows: the rivals' timings that overlapped ours
    flags: list[str] = field(default_factory=list)  # the verdicts' flags (wall_clock_disagrees, ...)
    # each timing's clocks a call: the events' median, the worker's wall-clock block and the one this process
    # clocked around its block (`external`): which of them a `wall_clock_disagrees` came from
    clocks: list[dict] = field(default_factory=list)
    problem: str = ""

    @property
    def median_ms(self) -> float | None:
        return statistics.median(self.kernelsearch_ms) if self.kernelsearch_ms else None

    @property
    def difference(self) -> float | None:
        """kernelsearch over the yardstick, minus 1."""
        if self.median_ms is None or not self.yardstick_ms:
            return None
        return self.median_ms / self.yardstick_ms - 1

    @property
    def agrees(self) -> bool | None:
        if self.difference is None:
            return None
        return abs(self.difference) <= TOLERANCE or abs(self.median_ms - self.yardstick_ms) <= TOLERANCE_MS

    @property
    def repeat_spread(self) -> float | None:
        ts = self.kernelsearch_ms
        return max(ts) / min(ts) - 1 if len(ts) > 1 and min(ts) > 0 else None

    @property
    def repeats(self) -> bool | None:
        s = self.repeat_spread
        return None if s is None else s <= REPEAT_TOLERANCE

    @property
    def eager_ratio(self) -> float | None:
        return self.median_ms / self.baseline_ms if self.baseline_ms and self.median_ms else None

    @property
    def eager_within_spread(self) -> bool | None:
        r = self.eager_ratio
        return None if r is None else abs(r - 1) <= max([*self.spreads, 0.01])

    def line(self) -> str:
        times = " ".join(f"{t:.4f}" for t in self.kernelsearch_ms) or "-"
        text = (f"{self.kind:14s} {self.handling:8s} {self.name:62s} {_fmt(self.yardstick_ms, '.4f'):>9s} {times:>22s} "
                f"{_pct(self.difference):>7s} {_ok(self.agrees):>4s} {_pct(self.repeat_spread, False):>6s} {_ok(self.repeats):>4s}")
        if self.kind == "eager":
            text += (f"  baseline {_fmt(self.baseline_ms, '.4f')} ms, ratio {_fmt(self.eager_ratio, '.3f')} "
                     f"(spread {'/'.join(_pct(s, False) for s in self.spreads) or '-'}) {_ok(self.eager_within_spread)}")
        if self.rival_timings is not None:
            text += f"  rival timings {self.rival_timings} within these evaluations (their checks and lock waits included)"
        if self.compilers:
            text += f"  compilers {'/'.join(map(str, self.compilers))}"
        if self.flags:
            text += f"  flags {','.join(sorted(set(self.flags)))}"
        if "wall_clock_disagrees" in self.flags or any(c.get("rounds", "1,1")[0] != "1" for c in self.clocks):
            # which clock disagreed (events / worker's wall / this process's), the rounds each wall clock took
            # and how long each block's final synchronise waited for the GPU (ms)
            text += "  clocks " + " ".join("/".join(_fmt(c.get(k), ".4f") for k in ("median", "wall", "external"))
                                           + f" r{c.get('rounds', '1,1')} d" + ",".join(_fmt(d, ".3f") for d in c.get("drains") or [])
                                           for c in self.clocks)
        if self.problem:
            text += f"  [{self.problem[:160]}]"
        return text


HEADER = (f"{'case':14s} {'builds':8s} {'candidate':62s} {'quiet ms':>9s} {'kernelsearch ms':>22s} {'diff':>7s} {'ok':>4s} "
          f"{'spread':>6s} {'ok':>4s}")


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _pct(v, signed: bool = True) -> str:
    return "-" if v is None else f"{100 * v:+.1f}%" if signed else f"{100 * v:.1f}%"


def _ok(v) -> str:
    return "-" if v is None else "yes" if v else "NO"


# ---------------------------------------------------------------- selection


def correct_candidates(device: str) -> dict[str, list[Path]]:
    """Task id -> its correct candidate files for this device."""
    found: dict[str, list[Path]] = {}
    for f in sorted((ROOT / "candidates").glob("level*/*/*.py")):
        if (device == "cpu") != f.stem.endswith("_cpp"):
            continue
        if "expected verdict: correct" not in f.read_text().splitlines()[0]:
            continue
        found.setdefault(f"{f.parent.parent.name}/{f.parent.name}", []).append(f)
    return found


def eager_source(task: Task) -> str:
    return task.code + "\n\nclass ModelNew(Model):\n    pass\n"


# ---------------------------------------------------------------- the two clocks


def yardstick(cases: list[Case], oracle: Oracle, device: str, timeout_s: float) -> dict[str, dict]:
    """The minimal event timer's figures for every case (eager cases: the task's Model), one process."""
    items, seen = [], set()
    for c in cases:
        if c.key not in seen:
            seen.add(c.key)
            items.append({"label": c.key, "task_code": c.task.code, "candidate": str(c.path) if c.path else None})
    job = {"device": device, "cache": str(oracle.builds.root), "gpu_arch": oracle.gpu_arch, "calls": 100, "warmup": 10,
           "items": items}
    found: dict[str, dict] = {}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(job, f)
    try:
        proc = subprocess.Popen([sys.executable, str(ROOT / "event_timer.py"), f.name], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=str(ROOT.parent))
        timer = threading.Timer(timeout_s, proc.kill)
        timer.start()
        try:
            for line in proc.stdout:
                try:
                    data = json.loads(line)
                except ValueError:
                    continue
                found[data["label"]] = data
                rounds = ", ".join(f"{ms:.4f}" for ms in data.get("round_ms", []))
                what = f"{data['median_ms']:.4f} ms (rounds {rounds})" if "median_ms" in data else data.get("error")
                print(f"  quiet event timer: {data['label'].split('@')[0]}: {what}", flush=True)
            proc.wait()
        finally:
            timer.cancel()
        if proc.returncode:
            print(f"  the event timer ended with code {proc.returncode}: {proc.stderr.read()[-500:]}", flush=True)
    finally:
        os.unlink(f.name)
    return found


def yardstick_for(found: dict[str, dict], case: Case) -> tuple[float | None, str]:
    data = found.get(case.key) or {}
    return data.get("median_ms"), data.get("error", "" if data else "not timed by the event timer")


def kernelsearch_times(oracle: Oracle, case: Case, n: int, row: Row, storm: Storm | None = None) -> None:
    """`n` evaluations of the case, each in a fresh worker; eager cases re-time their baseline too."""
    for _ in range(n):
        row.compilers.append(compilers_running(oracle))
        v: Verdict = oracle.check_and_time(case.task, case.candidate, case.build, fresh_baseline=case.kind == "eager",
                                           quiet=storm.quiet if storm else None)
        if v.status != "correct" or not v.time_ms:
            row.problem = f"{v.status}: {v.message}"
            return
        row.kernelsearch_ms.append(v.time_ms)
        row.flags += v.flags
        timed = v.timing.get("candidate") or {}
        row.clocks.append({**{k: timed.get(f"{k}_ms") for k in ("median", "wall", "external")},
                           "rounds": f"{timed.get('wall_rounds', 1)},{timed.get('block_rounds', 1)}",
                           "drains": [timed.get("wall_drain_ms"), timed.get("external_drain_ms")]})
        if case.kind == "eager":
            row.baseline_ms = v.eager_ms
            row.spreads = [float((v.timing.get(k) or {}).get("spread") or 0.0) for k in ("candidate", "eager")]


# ---------------------------------------------------------------- a second process timing at once


def rival_loop(args) -> None:
    """Run as a rival: time `--rival`'s eager baseline again and again (each a full reference computation
    holding the device alone, as an `eval` does), writing each timing's monotonic start and end, until
    the stop file appears."""
    task = load_tasks(args.source, Selection(task_ids=frozenset({args.rival_loop})), args.max_input_mb).tasks[0]
    oracle = Oracle(OracleConfig(device=args.device, compile_baseline=False, call_timeout_s=30, cache_dir=args.cache))
    oracle.references.get(task)
    log = Path(args.rival_log)
    Path(str(log) + ".ready").touch()
    while not Path(args.rival_stop).exists():
        # retime_eager holds the device alone itself (the locks are not reentrant: no outer hold); the
        # interval logged starts once its wait for the machine-wide lock is over.
        lock = oracle.quiet.lock
        t0, waited = time.monotonic(), lock.machine_wait_s
        oracle.references.retime_eager(task)
        t1 = time.monotonic()
        t0 += lock.machine_wait_s - waited
        with log.open("a") as f:
            f.write(json.dumps([t0, t1]) + "\n")
        # A run or an eval does other work between its timings; a loop that took the lock again at once
        # would keep this process's checks out for good (the machine-wide lock queues no one).
        time.sleep(0.05)


def second_process_row(oracle: Oracle, case: Case, args, rival_task: str, work: Path) -> Row:
    row = Row(case.kind, case.name, dict(case.task.sizes), None)
    stop = work / "rivals.stop"
    procs, logs = [], []
    for i in range(args.rivals):
        log = work / f"rival{i}.jsonl"
        logs.append(log)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--rival-loop", rival_task, "--rival-log", str(log),
               "--rival-stop", str(stop), "--device", args.device, "--source", args.source,
               "--max-input-mb", str(args.max_input_mb)] + (["--cache", str(args.cache)] if args.cache else [])
        procs.append(subprocess.Popen(cmd, cwd=str(ROOT.parent), stdout=subprocess.DEVNULL,
                                      stderr=open(work / f"rival{i}.err", "w")))
    try:
        deadline = time.monotonic() + 300
        while not all(Path(str(log) + ".ready").exists() for log in logs):
            if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
                row.problem = "a rival process did not start: " + (work / "rival0.err").read_text()[-300:]
                return row
            time.sleep(0.2)
        ours = []
        for _ in range(args.timings):
            t0 = time.monotonic()
            kernelsearch_times(oracle, case, 1, row)
            ours.append((t0, time.monotonic()))
            if row.problem:
                break
    finally:
        stop.touch()
        for p in procs:
            try:
                p.wait(120)
            except subprocess.TimeoutExpired:
                p.kill()
    theirs = [json.loads(line) for log in logs if log.exists() for line in log.read_text().splitlines() if line.strip()]
    row.rival_timings = sum(1 for a, b in theirs for c, d in ours if a < d and c < b)
    return row


# ---------------------------------------------------------------- the run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    ap.add_argument("--source", default=next((str(p) for p in DATA if p.exists()), str(DATA[0])))
    ap.add_argument("--tasks", help=f"comma-separated task ids (default: {','.join(DEFAULT_TASKS)})")
    ap.add_argument("--all", action="store_true", help="every task with a correct candidate for the device")
    ap.add_argument("--max-input-mb", type=float, default=128)
    ap.add_argument("--timings", type=int, default=2, help="fresh-process kernelsearch timings per candidate")
    ap.add_argument("--storm", type=int, default=None, help="cold builds running beside the timing (default: cores - 1)")
    ap.add_argument("--launch-bound", default=None, help="task of the launch-bound case (default: level-2 GEMM epilogue)")
    ap.add_argument("--launch-bound-mb", type=float, default=0.0625, help="input budget that makes it launch-bound")
    ap.add_argument("--rival", default=None, help="task whose eager baseline the rival processes time")
    ap.add_argument("--rivals", type=int, default=1, help="other processes timing on the device at once")
    ap.add_argument("--compilers", default="asis", help="what is done about the builds while timing, one pass of "
                    "the rows each: asis (whatever the oracle does), stop (stopped for each timing), reserve (kept "
                    "off the oracle.cores timing cores, niced), unplaced (as the oracle does, the timing process "
                    "left on its own cores), e.g. asis,stop,reserve or asis,unplaced")
    ap.add_argument("--skip", default="", help="sections to leave out: eager, launch, rival")
    ap.add_argument("--jobs", type=int, default=None, help="parallel builds of the candidates (default: cores)")
    ap.add_argument("--budget-s", type=float, default=290, help="start no new row after this many seconds")
    ap.add_argument("--cache", type=Path, default=None, help="cache folder (default: $KERNELSEARCH_CACHE)")
    ap.add_argument("--out", type=Path, default=None, help="the rows as JSON")
    ap.add_argument("--rival-loop", help=argparse.SUPPRESS)
    ap.add_argument("--rival-log", help=argparse.SUPPRESS)
    ap.add_argument("--rival-stop", help=argparse.SUPPRESS)
    args = ap.parse_args()
    import torch

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped"))  # the builds and rivals are closed on the way out
    if args.rival_loop:
        rival_loop(args)
        return
    t_start = time.monotonic()
    cores = len(os.sched_getaffinity(0))
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    handlings = [h.strip() for h in args.compilers.split(",") if h.strip()]
    if not handlings or set(handlings) - {"asis", "stop", "reserve", "unplaced"}:
        sys.exit(f"error: --compilers takes asis, stop, reserve and unplaced, not {args.compilers!r}")
    unknown = skip - {"eager", "launch", "rival"}
    if unknown:
        sys.exit(f"error: unknown section(s) to skip: {', '.join(sorted(unknown))} (eager, launch, rival)")
    by_task = correct_candidates(args.device)
    wanted = sorted(by_task) if args.all else [t.strip() for t in (args.tasks or ",".join(DEFAULT_TASKS)).split(",") if t.strip()]
    missing = [t for t in wanted if t not in by_task]
    for t in missing:
        print(f"{t}: no correct {'C++' if args.device == 'cpu' else 'CUDA'} candidate in benchmarks/candidates: skipped")
    ids = [t for t in wanted if t in by_task]
    launch_id = args.launch_bound or LAUNCH_BOUND[args.device]
    rival_target, rival_task = RIVAL[args.device]
    rival_task = args.rival or rival_task
    loaded = load_tasks(args.source, Selection(task_ids=frozenset([*ids, rival_target])), args.max_input_mb)
    for e in loaded.errors:
        print(f"task {e.id} skipped: {e.reason}")
    tasks = {t.id: t for t in loaded.tasks}
    oracle = Oracle(OracleConfig(device=args.device, allow_torch=True, compile_baseline=False, call_timeout_s=30,
                                 cache_dir=args.cache))
    print(f"device {oracle.device_name}, torch {torch.__version__}, {cores} cores; {len(ids)} tasks; "
          f"{args.timings} fresh-process timings each", flush=True)

    cases: list[Case] = []
    for tid in ids:
        if tid not in tasks:
            continue
        cases += [Case("kernel", tasks[tid], f.stem, f) for f in by_task[tid]]
        if "eager" not in skip:
            cases.append(Case("eager", tasks[tid], "eager", None))
    if "launch" not in skip:
        if launch_id not in by_task:
            print(f"launch-bound case {launch_id}: no correct candidate for this device: skipped")
        else:
            small = load_tasks(args.source, Selection(task_ids=frozenset({launch_id})), args.launch_bound_mb).tasks
            if small:
                tag = f" @{args.launch_bound_mb:g}MB"
                cases.append(Case("launch-bound", small[0], by_task[launch_id][0].stem, by_task[launch_id][0], tag))
                if "eager" not in skip:
                    cases.append(Case("eager", small[0], "eager", None, tag))
    if "rival" not in skip and args.rivals > 0:
        if rival_target not in by_task or rival_target not in tasks:
            print(f"second-process case {rival_target}: no correct candidate for this device: skipped")
        else:
            cases.append(Case("second process", tasks[rival_target], by_task[rival_target][0].stem,
                              by_task[rival_target][0]))
    if not cases:
        sys.exit("error: nothing to time")

    # 1. Build every candidate (in parallel, as a run's build slots do) while the references are made.
    t0 = time.monotonic()
    for c in cases:
        c.candidate = oracle.extract(c.task, eager_source(c.task) if c.path is None else c.path.read_text())
    with ThreadPoolExecutor(max_workers=(args.jobs or cores) + 1) as pool:
        refs = pool.submit(lambda: [oracle.references.get(t) for t in {c.task.code: c.task for c in cases}.values()])
        futures = {}  # one build per source: the same file at another size is the same build
        for c in cases:
            if isinstance(c.candidate, Candidate) and c.candidate.source not in futures:
                futures[c.candidate.source] = pool.submit(oracle.build, c.candidate)
        for c in cases:
            c.build = futures[c.candidate.source].result() if isinstance(c.candidate, Candidate) else None
        refs.result()
    print(f"built {len(futures)} candidates and made {len({c.task.code for c in cases})} references in "
          f"{time.monotonic() - t0:.0f} s", flush=True)

    # 2. The yardstick, on a quiet machine.
    print("\nthe minimal event timer, quiet (fixed inputs, L2 flushed, 3 rounds of 100 calls):", flush=True)
    timeable = [c for c in cases if isinstance(c.candidate, Candidate) and c.build and c.build.ok]
    with compilers_stopped(oracle):
        found = yardstick(timeable, oracle, args.device, timeout_s=max(60.0, args.budget_s))

    # 3. kernelsearch, with the builds running; then with rival processes timing at once.
    rows: list[Row] = []
    left: list[str] = []
    storm_n = cores - 1 if args.storm is None else args.storm
    throughput: dict[str, str] = {}
    storm_case = next((c for c in cases if c.path and "#include <torch/extension.h>" in c.path.read_text()), None)
    storm = None
    # The launch-bound cases first (the ones a busy machine gets wrong), and a minute kept for the
    # second process at the end.
    storm_cases = sorted((c for c in cases if c.kind != "second process"), key=lambda c: not c.tag)
    reserve_s = 60.0 if any(c.kind == "second process" for c in cases) else 0.0
    print("\n" + HEADER, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for handling in handlings:
            storm = None
            try:
                for c in storm_cases:
                    if time.monotonic() - t_start > args.budget_s - reserve_s:
                        left.append(f"{c.name} ({handling})")
                        continue
                    if storm is None and storm_n > 0 and storm_case is not None:
                        storm = Storm(oracle, storm_case.task, storm_case.path.read_text(), storm_n, handling)
                        running = storm.start()
                        print(f"({handling}: {storm_n} cold builds of {storm_case.name} running beside the timings, "
                              f"{running} compiler processes)", flush=True)
                    rows.append(run_case(oracle, c, args, found, storm))
                    print(rows[-1].line(), flush=True)
            finally:
                if storm is not None:
                    storm.stop()
                    print(f"({handling}: {storm.throughput()})", flush=True)
                    throughput[handling] = storm.throughput()
        for c in cases:
            if c.kind != "second process":
                continue
            if time.monotonic() - t_start > args.budget_s:
                left.append(c.name)
                continue
            with compilers_stopped(oracle):
                row = second_process_row(oracle, c, args, rival_task, Path(tmp))
            row.yardstick_ms, problem = yardstick_for(found, c)
            row.problem = row.problem or problem
            rows.append(row)
            print(row.line(), flush=True)

    summary(rows, left, throughput, time.monotonic() - t_start)
    if args.out:
        args.out.write_text(json.dumps({"device": oracle.device_name, "torch": torch.__version__, "cores": cores,
                                        "storm": storm_n, "throughput": throughput, "rows": [asdict(r) for r in rows],
                                        "not_run": left}, indent=1))


def run_case(oracle: Oracle, case: Case, args, found: dict[str, dict], storm: Storm | None) -> Row:
    ystick, problem = yardstick_for(found, case)
    row = Row(case.kind, case.name, dict(case.task.sizes), ystick, storm.handling if storm else "-", problem=problem)
    if not isinstance(case.candidate, Candidate):
        row.problem = f"{case.candidate.status}: {case.candidate.message}"
    elif case.build is None or not case.build.ok:
        row.problem = f"build: {case.build.status if case.build else '?'}: {case.build.message if case.build else ''}"
    else:
        kernelsearch_times(oracle, case, 1 if case.kind == "eager" else args.timings, row, storm)
    return row


def summary(rows: list[Row], left: list[str], throughput: dict[str, str], wall_s: float) -> None:
    print("\nsummary")
    print(HEADER)
    for r in rows:
        print(r.line())
    for handling in dict.fromkeys(r.handling for r in rows):
        mine = [r for r in rows if r.handling == handling]
        judged = [r for r in mine if r.agrees is not None]
        repeated = [r for r in mine if r.repeats is not None]
        eager = [r for r in mine if r.eager_within_spread is not None]
        what = {"-": "without builds", "asis": "builds running, as the oracle handles them",
                "stop": "builds stopped for each timing", "reserve": "builds kept off the timing cores",
                "unplaced": "as the oracle handles them, the timing process not moved onto the timing cores"}[handling]
        print(f"\n{what}{': ' + throughput[handling] if handling in throughput else ''}")
        print(f"  within {100 * TOLERANCE:.0f}% (or {1e3 * TOLERANCE_MS:.0f} us) of the quiet event timer: "
              f"{sum(bool(r.agrees) for r in judged)} of {len(judged)}")
        print(f"  fresh-process timings within {100 * REPEAT_TOLERANCE:.0f}% of each other: "
              f"{sum(bool(r.repeats) for r in repeated)} of {len(repeated)}")
        if eager:
            ratios = [r.eager_ratio for r in eager]
            print(f"  eager against itself 1.00 within the spread: {sum(bool(r.eager_within_spread) for r in eager)} of "
                  f"{len(eager)} (ratios {min(ratios):.3f}-{max(ratios):.3f})")
    if left:
        print(f"not run (--budget-s reached): {', '.join(left)}")
    print(f"wall time {wall_s:.0f} s")


if __name__ == "__main__":
    main()
