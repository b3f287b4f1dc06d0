"""Does the profiler's warm-up, started beside device work, leave a process's profiling blind?

    python benchmarks/profiler_race.py [--processes 16] [--parallel 6] [--busy-s 2.0] [--out FILE.json]

A candidate's worker warms its profiling on a thread (`oracle.harness.warm_profiler`: a dispatch mode's first
use, then the CUDA profiler's first start) while its main thread runs the checks. A worker on standby warms
up before its job comes, so the two rarely overlap; the first candidate of a fresh oracle takes a worker
that started just then. Twice on GPUs, such a candidate's profiled call recorded nothing in all of its
sessions, not even their fillers (`oracle.kernels_seen.Seen.blind`). Each variant runs in fresh processes:
- `overlap`: the warm-up thread starts as the main thread begins `--busy-s` seconds of kernel launches;
- `before`: the warm-up is joined first, then the same launches;
- `none`: no warm-up, the same launches.
Then one profiling session as the worker opens it (`oracle.kernels_seen`) around a ReLU call, as many as
`PROFILE_TRIES` while it sees no kernel. Prints, per variant, how many processes were blind or missed the
call's kernel, as a short table last.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VARIANTS = ("overlap", "before", "none")


def one_process(variant: str, busy_s: float) -> dict:
    """In this (fresh) process: CUDA set up, the variant's warm-up and launches, then the profiled call."""
    import torch

    from oracle import harness, kernels_seen

    x = torch.randn(1 << 24, device="cuda")
    torch.cuda.synchronize()
    warming = harness.warm_profiler("cuda") if variant in ("overlap", "before") else None
    if variant == "before":
        warming.join()
    started = time.perf_counter()
    launches = 0
    while time.perf_counter() - started < busy_s:  # device work on this thread, as a worker's checks
        for _ in range(20):
            x.mul_(1.0000001).add_(1e-7)
            launches += 2
        torch.cuda.synchronize()
    warm_left_s = 0.0
    if warming is not None:
        t = time.perf_counter()
        warming.join()
        warm_left_s = time.perf_counter() - t
    sessions = []
    for _ in range(harness.PROFILE_TRIES):
        with kernels_seen.kernels_seen() as seen:
            torch.relu(x)
        sessions.append(seen.counts())
        if seen.names:
            break
    return {"variant": variant, "sessions": sessions, "blind": all(n == 0 and f == 0 for n, f, _ in sessions),
            "call_seen": sessions[-1][0] > 0, "launches": launches, "warm_left_s": round(warm_left_s, 3)}


def _child(variant: str, busy_s: float, queue) -> None:
    try:
        queue.put(one_process(variant, busy_s))
    except Exception as exc:  # noqa: BLE001 - reported in the table
        queue.put({"variant": variant, "error": f"{type(exc).__name__}: {exc}"})


def run(processes: int, parallel: int, busy_s: float) -> list[dict]:
    """`processes` fresh processes per variant, the variants interleaved, `parallel` at a time."""
    ctx = mp.get_context("spawn")
    order = [v for _ in range(processes) for v in VARIANTS]
    results: list[dict] = []
    while order:
        batch, order = order[:parallel], order[parallel:]
        queue = ctx.Queue()
        procs = [ctx.Process(target=_child, args=(v, busy_s, queue)) for v in batch]
        for p in procs:
            p.start()
        for v in batch:
            try:
                results.append(queue.get(timeout=300))
            except Exception:  # noqa: BLE001 - a process that never answered
                results.append({"variant": v, "error": "no answer in 300 s"})
        for p in procs:
            p.join(10)
    return results


def table(results: list[dict]) -> list[dict]:
    rows = []
    for v in VARIANTS:
        mine = [r for r in results if r.get("variant") == v]
        ok = [r for r in mine if "error" not in r]
        rows.append({"variant": v, "processes": len(mine), "errors": len(mine) - len(ok),
                     "blind": sum(r["blind"] for r in ok), "call_missed": sum(not r["call_seen"] for r in ok),
                     "retried": sum(len(r["sessions"]) > 1 for r in ok),
                     "warm_left_s_max": max((r["warm_left_s"] for r in ok), default=None)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=16, help="fresh processes per variant")
    ap.add_argument("--parallel", type=int, default=6)
    ap.add_argument("--busy-s", type=float, default=2.0, help="seconds of kernel launches beside the warm-up")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    results = run(args.processes, args.parallel, args.busy_s)
    rows = table(results)
    if args.out:
        args.out.write_text(json.dumps({"results": results, "table": rows}, indent=1))
    for r in results:
        if "error" in r:
            print("error:", r["variant"], r["error"])
    print(f"{'variant':8s} {'procs':>5s} {'errors':>6s} {'blind':>5s} {'missed':>6s} {'retried':>7s} {'warm left max s':>15s}")
    for r in rows:
        print(f"{r['variant']:8s} {r['processes']:5d} {r['errors']:6d} {r['blind']:5d} {r['call_missed']:6d} "
              f"{r['retried']:7d} {r['warm_left_s_max']!s:>15s}")


if __name__ == "__main__":
    main()
