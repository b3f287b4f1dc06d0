"""What a candidate's profiled call costs in a fresh worker process, and whether warming the profiler up
beside the checks hides it.

    python benchmarks/profiler_cost.py [--repeats 3] [--out FILE.json]

The oracle profiles one call of every candidate that passes its checks (`oracle.harness._profile_call_timed`:
its kernel names for the own-kernel rule, its GPU busy time for the launch-bound flag), in the candidate's
own fresh worker process. Each variant runs in a fresh process, `--repeats` times:
- `cold`: CUDA set up and one call made, then the profiled call timed (what a worker does today);
- `again`: a second profiled call in the same process (the profiler already started once);
- `warmed`: the profiler started and stopped once in a background thread at process start while the main
  thread makes six calls (standing in for the checks), then the profiled call timed.
Prints the medians (s) as a short table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _one(variant: str) -> dict[str, float]:
    import torch

    from oracle.harness import _profile_call_timed, warm_profiler

    device = "cuda" if torch.cuda.is_available() else "cpu"
    started = time.perf_counter()
    warming = warm_profiler(device) if variant == "warmed" else None
    x = torch.randn(1 << 20, device=device)
    fn = torch.nn.ReLU()
    for _ in range(6):  # the checks
        fn(x)
        if device == "cuda":
            torch.cuda.synchronize()
    before = time.perf_counter()
    if warming is not None:
        warming.join()
    joined = time.perf_counter()
    _profile_call_timed(fn, [x], device)
    first = time.perf_counter()
    _profile_call_timed(fn, [x], device)
    second = time.perf_counter()
    return {"setup_s": before - started, "join_s": joined - before, "profiled_s": first - joined,
            "again_s": second - first}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--one", choices=["cold", "warmed"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(_one(args.one)))
        return
    rows: dict[str, list[dict[str, float]]] = {"cold": [], "warmed": []}
    for _ in range(args.repeats):
        for variant in rows:
            proc = subprocess.run([sys.executable, __file__, "--one", variant], capture_output=True, text=True, timeout=300)
            if proc.returncode:
                print(f"{variant}: failed: {proc.stderr.strip().splitlines()[-1:]}")
                continue
            rows[variant].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    table = {v: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for v, runs in rows.items() if runs}
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "medians": table}, indent=1))
    print(f"{'variant':8} {'setup s':>8} {'join s':>8} {'profiled s':>11} {'again s':>8}   (medians of {args.repeats})")
    for variant, m in table.items():
        print(f"{variant:8} {m['setup_s']:8.3f} {m['join_s']:8.3f} {m['profiled_s']:11.3f} {m['again_s']:8.3f}")


if __name__ == "__main__":
    main()
