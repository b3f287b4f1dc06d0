"""Evaluate our hand-written candidates for KernelBench tasks with the oracle, and print a table.

    python benchmarks/oracle_gpu.py [--device cuda] [--source PATH] [--max-input-mb 128] [--jobs 16] [--out FILE.json]

Every `benchmarks/candidates/levelN/<task>/<variant>.py` is extracted, built (builds run in parallel, as the
engine's CPU build slots do), then checked and timed one at a time on the device. Each file's first line
names the verdict it must get. Then every correct candidate is re-timed twice more, each time in a fresh
worker process, to show how well a median repeats; and the cost of starting a worker is measured.
On a CPU (`--device cpu`) only the `*_cpp.py` variants run.
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

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

from oracle import Oracle, OracleConfig, Verdict  # noqa: E402
from oracle.candidate import Candidate  # noqa: E402
from oracle.harness import build_entry  # noqa: E402
from oracle.sandbox import Worker, run_to_result  # noqa: E402
from tasks import Selection, load_tasks  # noqa: E402

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--source", default=next((str(p) for p in DATA if p.exists()), str(DATA[0])))
    ap.add_argument("--candidates", default=str(ROOT / "candidates"))
    ap.add_argument("--max-input-mb", type=float, default=128)
    ap.add_argument("--jobs", type=int, default=16, help="parallel builds")
    ap.add_argument("--retime", type=int, default=1, help="extra fresh-process timings of each correct candidate")
    ap.add_argument("--call-timeout", type=float, default=20, help="seconds a single call may take")
    ap.add_argument("--out", help="write all verdicts as JSON here")
    args = ap.parse_args()

    t_start = time.perf_counter()
    files = candidate_files(Path(args.candidates), args.device)
    wanted = sorted({tid for tid, _ in files})
    loaded = load_tasks(args.source, Selection(task_ids=frozenset(wanted)), args.max_input_mb)
    tasks = {t.id: t for t in loaded.tasks}
    for e in loaded.errors:
        print(f"task {e.id} skipped: {e.reason}")
    oracle = Oracle(OracleConfig(device=args.device, call_timeout_s=args.call_timeout))
    print(f"{len(files)} candidates for {len(tasks)} tasks on {oracle.device_name} (arch {oracle.gpu_arch}), "
          f"inputs fitted to {args.max_input_mb:g} MB")

    candidates: list[tuple[Path, Candidate | Verdict]] = [
        (f, oracle.extract(tasks[tid], f.read_text())) for tid, f in files if tid in tasks
    ]
    # Builds (CPU slots) in parallel; meanwhile the references and baselines are computed on the device.
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.jobs + 1) as pool:
        refs = pool.submit(lambda: [oracle.reference(t) for t in tasks.values()])
        builds = {f: pool.submit(oracle.build, c) for f, c in candidates if isinstance(c, Candidate)}
        builds = {f: b.result() for f, b in builds.items()}
        refs.result()
    build_wall = time.perf_counter() - t0
    print(f"built {len(builds)} candidates and {len(tasks)} references/baselines in {build_wall:.0f} s wall")

    rows = []
    for f, c in candidates:
        task = tasks[f"{f.parent.parent.name}/{f.parent.name}"]
        v = c if isinstance(c, Verdict) else oracle.check_and_time(task, c, builds[f])
        rows.append((f, v))
        print(f"  {task.id} {f.stem}: {v.status} - {v.message[:160]}", flush=True)

    retimes = []
    for f, v in rows:
        if v.status != "correct" or args.retime <= 0:
            continue
        task = tasks[f"{f.parent.parent.name}/{f.parent.name}"]
        c = oracle.extract(task, f.read_text())
        times = [v.time_ms] + [oracle.check_and_time(task, c, oracle.build(c)).time_ms for _ in range(args.retime)]
        times = [t for t in times if t]
        retimes.append((task.id, times, max(times) / min(times) - 1))

    forked_s, fresh_s = worker_start_cost()
    print()
    header = f"{'task':58s} {'variant':16s} {'expected':17s} {'status':14s} {'build s':>8s} {'verify s':>8s} " \
             f"{'time ms':>9s} {'eager ms':>9s} {'compile ms':>10s} {'x eager':>8s} {'x compile':>9s}"
    print(header)
    print("-" * len(header))
    agree = 0
    for f, v in rows:
        exp = expected_status(f)
        ok = v.status in exp.split("/")
        agree += ok
        print(f"{v.task:58s} {f.stem:16s} {exp:17s} {v.status + ('' if ok else ' (!)'):14s} {fmt(v.build_s, '.1f'):>8s} "
              f"{fmt(v.verify_s, '.2f'):>8s} {fmt(v.time_ms, '.4f'):>9s} {fmt(v.eager_ms, '.4f'):>9s} "
              f"{fmt(v.compile_ms, '.4f'):>10s} {fmt(v.speedup_vs_eager, '.2f'):>8s} {fmt(v.speedup_vs_compile, '.2f'):>9s}")
    print(f"\nverdicts as expected: {agree} of {len(rows)}")
    if retimes:
        print("re-timing each correct candidate in fresh processes (median ms per process; spread = max/min - 1):")
        for tid, times, spread in retimes:
            print(f"  {tid:58s} {' '.join(f'{t:.4f}' for t in times)}  spread {100 * spread:.1f}%")
        print(f"  median spread {100 * statistics.median(s for *_, s in retimes):.1f}%, "
              f"max {100 * max(s for *_, s in retimes):.1f}%")
    print(f"worker start: {forked_s * 1e3:.0f} ms from the fork server vs {fresh_s * 1e3:.0f} ms for a fresh python + import torch")
    print(f"total wall time {time.perf_counter() - t_start:.0f} s")
    if args.out:
        Path(args.out).write_text(json.dumps({"verdicts": [v.to_json() for _, v in rows],
                                              "retimes": retimes, "worker_start_s": [forked_s, fresh_s]}, indent=1))


if __name__ == "__main__":
    main()
