"""Evaluate our hand-written candidates for KernelBench tasks with the oracle, and print a table.

    python benchmarks/oracle_gpu.py [--device cuda] [--source PATH] [--level N] [--ids 1-10] [--tasks ID,...]
                                    [--max-input-mb 128] [--jobs 16] [--retime 1] [--budget-s S] [--out FILE.jsonl]

Every `benchmarks/candidates/levelN/<task>/<variant>.py` of the selected tasks is extracted, built (builds run
in parallel, as the engine's CPU build slots do), then checked and timed one at a time on the device. Each
file's first line names the verdict it must get. A correct candidate is re-timed at once (`--retime` more
times, each in a fresh worker process) to show how well a median repeats. Rows print as they finish, and
`--out` gets each verdict as it comes, so a run cut short keeps what it measured; `--budget-s` ends the run
on time with a complete table. The cost of starting a worker is measured first.

The whole catalogue (53 CUDA candidates for 35 tasks) takes over 20 minutes on one H200, most of it the
`torch.compile` baselines (about 17 s a task, one task at a time) and the checks. The ten tasks of the
first table in RESULTS.md took about 10 minutes: under a 10-minute limit per command, run them as two
(`--level 1 --ids 19,21,23,36,47`, then `--level 2 --ids 1,2,4,7,9`). On a CPU (`--device cpu`) only the
`*_cpp.py` variants run.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

from oracle import Oracle, OracleConfig, Verdict
from oracle.candidate import Candidate
from oracle.harness import build_entry
from oracle.sandbox import Worker, run_to_result
from tasks import Selection, load_tasks
from tasks.selection import SelectionError

DATA = [ROOT.parent / ".shared" / "kernelbench" / "kernelbench_levels1-3.jsonl",
        ROOT.parent.parent / "shared" / "kernelbench" / "kernelbench_levels1-3.jsonl"]


def expected_status(path: Path) -> str:
    m = re.match(r"#\s*expected verdict:\s*([\w/]+)", path.read_text().splitlines()[0])
    return m.group(1) if m else "?"


def candidate_files(folder: Path, device: str) -> list[tuple[str, Path]]:
    found = []
    for f in sorted(folder.glob("level*/*/*.py")):
        is_cpp = f.stem.endswith("_cpp")
        if (device == "cpu") == is_cpp:
            found.append((f"{f.parent.parent.name}/{f.parent.name}", f))
    return found


def worker_start_cost(repeats: int = 5) -> tuple[float, float]:
    """Seconds to start a worker from the fork server, and a fresh `python -c 'import torch'`."""
    forked = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        outcome = run_to_result(Worker(build_entry, {"cache": "/tmp", "candidate_path": "none.py", "build_timeout_s": 30}))
        assert outcome.result is not None
        forked.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return statistics.median(forked), time.perf_counter() - t0


def fmt(value, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec)


def versions(oracle: Oracle) -> str:
    """One line naming what produced the figures: device, torch, Triton, nvcc, commit."""
    def run(cmd: list[str]) -> str:
        try:
            out = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=30, cwd=ROOT).stdout
        except (OSError, subprocess.SubprocessError):
            return "?"
        lines = [line for line in out.splitlines() if "release" in line] or out.splitlines() or ["?"]
        return lines[-1].strip()
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "none"
    return (f"{oracle.device_name} (arch {oracle.gpu_arch}), torch {torch.__version__}, Triton {triton_version}, "
            f"nvcc {run(['nvcc', '--version'])}, commit {run(['git', 'rev-parse', '--short', 'HEAD'])}")


HEADER = (f"{'task':58s} {'variant':16s} {'expected':17s} {'status':14s} {'build s':>8s} {'verify s':>8s} "
          f"{'time ms':>9s} {'eager ms':>9s} {'compile ms':>10s} {'x eager':>8s} {'x compile':>9s}  re-timed ms (spread)")


def row(v: Verdict, f: Path, exp: str, ok: bool, retimed: list[float]) -> str:
    again = ""
    if retimed:
        times = [v.time_ms, *retimed]
        again = f"  {' '.join(f'{t:.4f}' for t in retimed)} ({100 * (max(times) / min(times) - 1):.1f}%)"
    return (f"{v.task:58s} {f.stem:16s} {exp:17s} {v.status + ('' if ok else ' (!)'):14s} {fmt(v.build_s, '.1f'):>8s} "
            f"{fmt(v.verify_s, '.2f'):>8s} {fmt(v.time_ms, '.4f'):>9s} {fmt(v.eager_ms, '.4f'):>9s} "
            f"{fmt(v.compile_ms, '.4f'):>10s} {fmt(v.speedup_vs_eager, '.2f'):>8s} {fmt(v.speedup_vs_compile, '.2f'):>9s}{again}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--source", default=next((str(p) for p in DATA if p.exists()), str(DATA[0])))
    ap.add_argument("--candidates", default=str(ROOT / "candidates"))
    ap.add_argument("--level", type=int, help="only candidates for tasks of this level")
    ap.add_argument("--ids", help="only these problem ids, e.g. 19,21,23")
    ap.add_argument("--tasks", help="only these task ids, e.g. level1/19_ReLU,level2/9_Matmul_Subtract_Multiply_ReLU")
    ap.add_argument("--max-input-mb", type=float, default=128)
    ap.add_argument("--jobs", type=int, default=16, help="parallel builds")
    ap.add_argument("--retime", type=int, default=1, help="extra fresh-process timings of each correct candidate")
    ap.add_argument("--call-timeout", type=float, default=20, help="seconds a single call may take")
    ap.add_argument("--budget-s", type=float, help="start no new candidate after this many seconds; the table "
                                                   "then covers those that ran")
    ap.add_argument("--out", help="append each verdict as a JSON line here as soon as it is known")
    args = ap.parse_args()

    t_start = time.perf_counter()
    try:
        selection = Selection.from_flags(args.level, args.ids, args.tasks)
    except SelectionError as exc:
        sys.exit(f"error: {exc}")
    files = candidate_files(Path(args.candidates), args.device)
    wanted = sorted({tid for tid, _ in files})
    loaded = load_tasks(args.source, Selection(task_ids=frozenset(wanted)), args.max_input_mb)
    tasks = {t.id: t for t in loaded.tasks if selection.matches(t.id, t.level, t.problem_id)}
    for e in loaded.errors:
        print(f"task {e.id} skipped: {e.reason}")
    files = [(tid, f) for tid, f in files if tid in tasks]
    if not files:
        sys.exit("error: no candidate matches the selection")
    oracle = Oracle(OracleConfig(device=args.device, call_timeout_s=args.call_timeout))
    print(versions(oracle))
    print(f"{len(files)} candidates for {len(tasks)} tasks, inputs fitted to {args.max_input_mb:g} MB", flush=True)
    forked_s, fresh_s = worker_start_cost()
    print(f"worker start: {forked_s * 1e3:.0f} ms from the fork server vs {fresh_s * 1e3:.0f} ms for a fresh "
          f"python + import torch", flush=True)

    candidates: list[tuple[Path, Candidate | Verdict]] = [(f, oracle.extract(tasks[tid], f.read_text())) for tid, f in files]
    # Builds (CPU slots) in parallel; meanwhile the references and baselines are computed on the device.
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.jobs + 1) as pool:
        refs = pool.submit(lambda: [oracle.references.get(t) for t in tasks.values()])
        builds = {f: pool.submit(oracle.build, c) for f, c in candidates if isinstance(c, Candidate)}
        builds = {f: b.result() for f, b in builds.items()}
        refs.result()
    print(f"built {len(builds)} candidates and {len(tasks)} references/baselines in {time.perf_counter() - t0:.0f} s wall")
    print("\n" + HEADER + "\n" + "-" * len(HEADER), flush=True)

    # One candidate at a time: check, time, and re-time a correct one at once in fresh worker processes, so
    # that every printed row is complete even if the run is cut short.
    agree, spreads, left = 0, [], []
    for f, c in candidates:
        if args.budget_s is not None and time.perf_counter() - t_start > args.budget_s:
            left.append(f)
            continue
        task = tasks[f"{f.parent.parent.name}/{f.parent.name}"]
        v = c if isinstance(c, Verdict) else oracle.check_and_time(task, c, builds[f])
        retimed: list[float] = []
        if v.status == "correct" and isinstance(c, Candidate):
            for _ in range(args.retime):
                again = oracle.check_and_time(task, c, builds[f])
                if again.time_ms:
                    retimed.append(again.time_ms)
            if retimed and v.time_ms:
                spreads.append(max(v.time_ms, *retimed) / min(v.time_ms, *retimed) - 1)
        exp = expected_status(f)
        ok = v.status in exp.split("/")
        agree += ok
        print(row(v, f, exp, ok, retimed), flush=True)
        if not ok or v.status != "correct":
            print(f"    {v.message[:200]}", flush=True)
        if args.out:
            with open(args.out, "a") as out:
                out.write(json.dumps({"file": str(f.relative_to(ROOT)), "expected": exp, "retimed_ms": retimed,
                                      **v.to_json()}) + "\n")

    ran = len(candidates) - len(left)
    print(f"\nverdicts as expected: {agree} of {ran}" + (f" ({len(left)} not run: --budget-s reached)" if left else ""))
    if spreads:
        print(f"re-timing in fresh worker processes (spread = max/min - 1 of the medians): "
              f"median {100 * statistics.median(spreads):.1f}%, max {100 * max(spreads):.1f}% over {len(spreads)} candidates")
    print(f"total wall time {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
