"""Does the CUDA profiler lose a session's first kernel records, and do the fillers take their place?

Each variant runs in a fresh process: `--rounds` profiling sessions, `--idle` seconds apart, each around one
call of a one-kernel operator (ReLU). The upstream report needed the GPU idle about 15 s between sessions.
`plain` profiles the call alone with `torch.profiler`; `fillers` profiles it as the oracle does
(`oracle.kernels_seen`: Kineto's bindings, every session led by `oracle.profiler_head`'s fillers). A round is lost when the call's kernel is not
among the session's records. Usage: python3 benchmarks/profiler_head.py [--rounds 4] [--idle 15] [--out F]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def sessions(variant: str, rounds: int, idle_s: float) -> list[dict]:
    """In this process: one record per round, the call's kernel records seen and the fillers launched."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from oracle import kernels_seen, profiler_head

    x = torch.randn(1 << 20, device="cuda")
    torch.relu(x)
    torch.cuda.synchronize()
    out = []
    for _ in range(rounds):
        time.sleep(idle_s)  # GPU idle between sessions, as between a worker's checks and its profiled call
        if variant == "fillers":  # the oracle's own session
            before = profiler_head.sessions()
            with kernels_seen.kernels_seen() as seen:
                torch.relu(x)
            out.append({"call_kernels": len(seen.names), "filler_records": seen.fillers,
                        "fillers": before + 1 + profiler_head.SPARE_FILLERS, "names": sorted(seen.names)[:4]})
            continue
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            profiler_head.session_started()
            torch.relu(x)
            torch.cuda.synchronize()
        names = [e.name for e in prof.events() if "cuda" in str(getattr(e, "device_type", "")).lower()]
        out.append({"call_kernels": len(names), "filler_records": 0, "fillers": 0, "names": sorted(set(names))[:4]})
    return out


def _child(variant: str, rounds: int, idle_s: float, queue) -> None:
    try:
        queue.put(sessions(variant, rounds, idle_s))
    except Exception as exc:  # noqa: BLE001 - reported in the table
        queue.put({"error": f"{type(exc).__name__}: {exc}"})


def run_variant(variant: str, rounds: int, idle_s: float) -> list[dict] | dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_child, args=(variant, rounds, idle_s, queue))
    child.start()
    result = queue.get(timeout=120 + rounds * (idle_s + 10))
    child.join(30)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--idle", type=float, default=15.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    report = {v: run_variant(v, args.rounds, args.idle) for v in ("plain", "fillers")}
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    print(f"{'variant':8} {'rounds':>6} {'lost':>5}  call kernel records per round (filler records)")
    for variant, rows in report.items():
        if isinstance(rows, dict):
            print(f"{variant:8} error: {rows['error']}")
            continue
        lost = sum(r["call_kernels"] == 0 for r in rows)
        per = " ".join(f"{r['call_kernels']}({r['filler_records']}/{r['fillers']})" for r in rows)
        print(f"{variant:8} {len(rows):6d} {lost:5d}  {per}")
    names = sorted({n for rows in report.values() if isinstance(rows, list) for r in rows for n in r["names"]})
    print("kernel names seen:", names)


if __name__ == "__main__":
    main()
