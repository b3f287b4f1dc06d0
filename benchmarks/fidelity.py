"""Timing fidelity: does the oracle's clock repeat, and does it agree with itself across its two sides?

    python benchmarks/fidelity.py [--repeats 5] [--source PATH] [--max-input-mb 128] [--out FILE.json]

1. Eager PyTorch against itself: each task's own reference is submitted as a candidate (`ModelNew` is the
   reference `Model`, accepted with allow_torch) and timed by the candidate path, in a fresh worker each
   time, while the eager baseline is timed by the trusted reference path. The ratio must be 1.00 within the
   spread of the repeats: anything else is a bias between the two paths.
2. The same kernel re-timed: each correct candidate under `benchmarks/candidates/` for those tasks (CUDA on
   a GPU, `*_cpp.py` on a CPU) is checked and timed `--repeats` times, each in a fresh worker process;
   the spread of its medians (max/min - 1) is how far two timings of one kernel can disagree.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

from oracle import Oracle, OracleConfig  # noqa: E402
from tasks import Selection, load_tasks  # noqa: E402

DATA = [ROOT.parent / ".shared" / "kernelbench" / "kernelbench_levels1-3.jsonl",
        ROOT.parent.parent / "shared" / "kernelbench" / "kernelbench_levels1-3.jsonl"]


def spread(values: list[float]) -> float:
    return max(values) / min(values) - 1 if values else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", default=next((str(p) for p in DATA if p.exists()), str(DATA[0])))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-input-mb", type=float, default=128)
    ap.add_argument("--limit", type=int, default=None, help="at most this many tasks")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    files = sorted(f for f in (ROOT / "candidates").glob("level*/*/*.py")
                   if (device == "cpu") == f.stem.endswith("_cpp") and "expected verdict: correct" in f.read_text().splitlines()[0])
    by_task: dict[str, list[Path]] = {}
    for f in files:
        by_task.setdefault(f"{f.parent.parent.name}/{f.parent.name}", []).append(f)
    ids = sorted(by_task)[: args.limit]
    tasks = {t.id: t for t in load_tasks(args.source, Selection(task_ids=frozenset(ids)), args.max_input_mb).tasks}
    oracle = Oracle(OracleConfig(device=device, allow_torch=True, call_timeout_s=30))
    print(f"{len(tasks)} tasks, {args.repeats} fresh-process repeats each, device {oracle.device_name}", flush=True)
    report: dict = {"device": oracle.device_name, "torch": torch.__version__, "eager_vs_itself": [], "retimed": []}

    print("\neager PyTorch timed as a candidate against its own trusted baseline:")
    for tid in ids:
        task = tasks[tid]
        source = task.code + "\n\nclass ModelNew(Model):\n    pass\n"
        runs = [oracle.evaluate(task, source) for _ in range(args.repeats)]
        ok = [v for v in runs if v.status == "correct" and v.time_ms]
        if not ok:
            print(f"  {tid}: {runs[0].status}: {runs[0].message[:120]}")
            continue
        times = [v.time_ms for v in ok]
        ratio = ok[0].eager_ms / statistics.median(times)
        row = {"task": tid, "eager_ms": ok[0].eager_ms, "as_candidate_ms": times, "ratio": ratio, "spread": spread(times)}
        report["eager_vs_itself"].append(row)
        print(f"  {tid:58s} eager {ok[0].eager_ms:.4f} ms, as a candidate median {statistics.median(times):.4f} ms: "
              f"ratio {ratio:.3f}, spread of repeats {100 * row['spread']:.1f}%", flush=True)

    print("\nthe same kernel re-timed in fresh processes (median ms each):")
    for tid in ids:
        for f in by_task[tid]:
            runs = [oracle.evaluate(tasks[tid], f.read_text()) for _ in range(args.repeats)]
            times = [v.time_ms for v in runs if v.status == "correct" and v.time_ms]
            if len(times) < 2:
                print(f"  {tid}/{f.stem}: {runs[0].status}: {runs[0].message[:120]}")
                continue
            report["retimed"].append({"candidate": f"{tid}/{f.stem}", "times_ms": times, "spread": spread(times)})
            print(f"  {tid + '/' + f.stem:66s} {' '.join(f'{t:.4f}' for t in times)}  spread {100 * spread(times):.1f}%",
                  flush=True)

    ratios = [r["ratio"] for r in report["eager_vs_itself"]]
    spreads = [r["spread"] for r in report["retimed"]] + [r["spread"] for r in report["eager_vs_itself"]]
    if ratios:
        print(f"\neager vs itself: median ratio {statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f}) "
              f"over {len(ratios)} tasks")
    if spreads:
        print(f"spread of fresh-process medians: median {100 * statistics.median(spreads):.1f}%, max {100 * max(spreads):.1f}%")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
