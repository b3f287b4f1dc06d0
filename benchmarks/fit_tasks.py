"""Fit every KernelBench problem to the default CPU budget, run its reference once, and report.

    python benchmarks/fit_tasks.py [--source PATH] [--max-input-mb 256] [--level N] [--ids 1-10] [--out FILE.jsonl]

Prints, per task, the fitted input size and the time of one reference forward on this machine's CPU,
then a summary: how many ran, the slowest, and every failure with its reason.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from pathlib import Path

import torch

from tasks import Selection, load_tasks
from tasks.fitting import CPU_BUDGET_MB
from tasks.runtime import exec_task_code, one_line

DEFAULT_SOURCE = Path(__file__).resolve().parents[2] / "shared" / "kernelbench" / "kernelbench_levels1-3.jsonl"


def run_reference(code: str, origin: str) -> tuple[float, float]:
    """Build the model and time one forward; returns (build seconds, forward seconds)."""
    module = exec_task_code(code, origin)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    model = module.make_model()
    inputs = module.get_inputs()
    t1 = time.perf_counter()
    with torch.no_grad():
        model(*inputs)
    return t1 - t0, time.perf_counter() - t1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", default=str(DEFAULT_SOURCE))
    ap.add_argument("--max-input-mb", type=float, default=CPU_BUDGET_MB)
    ap.add_argument("--level", type=int)
    ap.add_argument("--ids")
    ap.add_argument("--out", help="write one JSON record per task here")
    args = ap.parse_args()
    warnings.simplefilter("ignore")

    t0 = time.perf_counter()
    loaded = load_tasks(args.source, Selection.from_flags(args.level, args.ids, None), args.max_input_mb)
    load_s = time.perf_counter() - t0
    records = [{"id": e.id, "status": "load_failed", "reason": e.reason} for e in loaded.errors]
    print(f"loaded and fitted {len(loaded.tasks)} tasks in {load_s:.1f} s ({len(loaded.errors)} failed to load)")
    for i, task in enumerate(loaded.tasks, 1):
        try:
            build_s, forward_s = run_reference(task.code, task.id)
            rec = {"id": task.id, "status": "ran", "input_mb": round(task.input_mb, 1),
                   "fitted": bool(task.original_sizes), "build_s": round(build_s, 3), "forward_s": round(forward_s, 3)}
        except Exception as exc:  # noqa: BLE001 - report every failure and go on
            rec = {"id": task.id, "status": "run_failed", "reason": one_line(exc)}
        records.append(rec)
        print(f"[{i:3d}/{len(loaded.tasks)}] {task.id:55s} {rec['status']:10s} "
              f"{rec.get('input_mb', ''):>7} MB  {rec.get('forward_s', rec.get('reason', ''))}", flush=True)
    if args.out:
        Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in records))

    ran = [r for r in records if r["status"] == "ran"]
    failed = [r for r in records if r["status"] != "ran"]
    times = sorted((r["forward_s"] for r in ran), reverse=True)
    print("\nsummary")
    print(f"  tasks: {len(records)}, ran: {len(ran)}, failed: {len(failed)}, fitted (shrunk): {sum(r['fitted'] for r in ran)}")
    if times:
        print(f"  forward seconds: median {statistics.median(times):.3f}, max {times[0]:.2f}, total {sum(times):.1f}")
        for r in sorted(ran, key=lambda r: -r["forward_s"])[:5]:
            print(f"  slowest: {r['id']} {r['forward_s']:.2f} s at {r['input_mb']} MB")
    for r in failed:
        print(f"  FAILED {r['id']}: {r['reason']}")
    print(f"  wall time: {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
