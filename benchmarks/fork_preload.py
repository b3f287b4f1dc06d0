"""What a worker's start costs with and without `oracle.preload` in its fork server, side by side.

    python benchmarks/fork_preload.py [--workers 12] [--device cuda] [--out FILE.json]

A candidate's worker, before its first check, sets up the device, warms up its profiling (a dispatch mode's
first call, which imports torch's dynamo machinery; on a GPU the profiler's first start) and imports
`torch.utils.cpp_extension` (`oracle.harness._on_standby`). Each variant starts a fresh process with its
fork server's preload list, then one worker alone and `--workers` at once, each doing that work and saying
when it was done and how much CPU it used, and whether it could use the device (a worker forked from a
process that asked torch about CUDA cannot).
Prints a short table last.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VARIANTS = {"torch+harness": ["torch", "oracle.harness"],
            "preload": ["torch", "oracle.preload", "oracle.harness"]}


def probe_entry(conn: Any, job_dir: str) -> None:
    """In the worker: what `oracle.harness._on_standby` does before a job, timed by this process's clocks."""
    from oracle.harness import _device_setup, warm_profiler
    from oracle.protocol import send

    device = json.loads((Path(job_dir) / "job.json").read_text())["device"]
    started = time.perf_counter()
    _device_setup(device)
    warm_profiler(device).join()
    import torch.utils.cpp_extension  # noqa: F401

    import torch

    ok = float(torch.ones(4, device=device).sum().item()) == 4.0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    send(conn, result={"ready_s": time.perf_counter() - started, "cpu_s": usage.ru_utime + usage.ru_stime, "device_ok": ok})


def one_variant(name: str, workers: int, device: str) -> dict[str, Any]:
    """In this (fresh) process: the fork server with the variant's preload, one worker alone, then many."""
    from benchmarks.fork_preload import probe_entry as entry  # by its module's name: the workers import it
    from oracle import sandbox

    sandbox.FORK_SERVER_PRELOAD = VARIANTS[name]
    job = {"device": device}

    def started(n: int) -> tuple[list[dict[str, Any]], float]:
        t0 = time.perf_counter()
        ws = [sandbox.Worker(entry, job) for _ in range(n)]
        outcomes = [sandbox.run_to_result(w) for w in ws]
        wall = time.perf_counter() - t0
        return [o.result or {"error": o.crashed or o.timed_out_phase or o.stderr_tail[-300:]} for o in outcomes], wall

    alone, alone_wall = started(1)  # the fork server's start and its imports included
    many, many_wall = started(workers)
    ready = [r["ready_s"] for r in many if "ready_s" in r]
    return {"variant": name,
            "alone_ready_s": round(alone[0].get("ready_s", float("nan")), 2), "alone_wall_s": round(alone_wall, 2),
            "many_wall_s": round(many_wall, 2), "many_ready_p50_s": round(statistics.median(ready), 2) if ready else None,
            "many_ready_max_s": round(max(ready), 2) if ready else None,
            "cpu_s_mean": round(statistics.mean(r["cpu_s"] for r in many if "cpu_s" in r), 2) if ready else None,
            "device_ok": sum(1 for r in alone + many if r.get("device_ok")), "workers": 1 + workers,
            "errors": [r["error"] for r in alone + many if "error" in r][:3]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=12)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--variant", choices=sorted(VARIANTS), help="run one variant in this process (internal)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(one_variant(args.variant, args.workers, args.device)))
        return
    rows = []
    for name in VARIANTS:  # each in a fresh process: its own fork server, nothing imported before it
        done = subprocess.run([sys.executable, "-m", "benchmarks.fork_preload", "--variant", name, "--workers",
                               str(args.workers), "--device", args.device], cwd=ROOT, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        rows.append(json.loads(lines[-1]) if lines else {"variant": name, "errors": [done.stderr[-500:]]})
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    keys = ["variant", "alone_wall_s", "alone_ready_s", "many_wall_s", "many_ready_p50_s",
            "many_ready_max_s", "cpu_s_mean", "device_ok", "workers"]
    print(" | ".join(keys))
    for row in rows:
        print(" | ".join(str(row.get(k)) for k in keys), *(["errors:", row["errors"]] if row.get("errors") else []))


if __name__ == "__main__":
    main()
