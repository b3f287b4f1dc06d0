"""How long the default precompiled header takes to make while builds hold the build cores, with the maker
niced like the builds (as before) and at the oracle's priority (`QuietDevice.header_maker` now).

The "builds" are busy loops placed as build workers are (`CorePlan.for_builds`: the build cores, nice 10,
each in a session of its own), two per build core by default, as fifteen ninja builds with nvcc and cc1plus
side by side are. Each header is
made from nothing in its own folder; the figures are the medians of `--repeats` makes per setting, the
settings taken in turn so that a change of load hits both alike.

    python3 benchmarks/header_priority.py [--busy N] [--repeats 3] [--out header_priority.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from oracle.build import with_build_flags  # noqa: E402
from oracle.cores import Placement, plan_cores  # noqa: E402
from oracle.pch import PchSpec, is_ready, spec_for  # noqa: E402

BUSY = "while True: pass"


def make_once(spec: PchSpec, placement: Placement) -> float:
    """Seconds to make the header in a fresh folder, the maker placed as given (cores and nice)."""
    with tempfile.TemporaryDirectory(prefix="ks-pch-bench-") as root:
        started = time.perf_counter()
        maker = subprocess.Popen([sys.executable, "-m", "oracle.pch", root, json.dumps(spec.to_json())],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                 cwd=str(Path(__file__).resolve().parent.parent))
        try:
            placement.apply_to(maker.pid)
            maker.wait()
        finally:  # the maker leads its own session: its compiler is not ours to outlive it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(maker.pid, signal.SIGKILL)
        seconds = time.perf_counter() - started
        if not is_ready(Path(root), spec):
            raise SystemExit("the header was not made: see `python3 -m oracle.pch` by hand")
        return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--busy", type=int, default=None, help="busy loops on the build cores (default: 2 per core)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cuda", action="store_true", help="the header of CUDA builds (needs a CUDA build of PyTorch)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    plan = plan_cores()
    spec = spec_for(with_build_flags({})["extra_cflags"], None, with_cuda=args.cuda)
    if spec is None:
        raise SystemExit("this PyTorch or compiler has no precompiled header to make")
    settings = {"niced like builds": plan.for_builds, "oracle's priority": Placement(plan.builds)}
    busy_n = args.busy if args.busy is not None else 2 * len(plan.builds)
    print(f"{plan.describe()}; {busy_n} busy loops at nice {plan.build_nice} on the build cores", flush=True)
    alone = make_once(spec, Placement(plan.builds))
    print(f"  alone: {alone:.1f} s", flush=True)
    # each in a session of its own, as build workers are (so each is its own scheduling group, niced as a group)
    busy = [subprocess.Popen([sys.executable, "-c", BUSY], start_new_session=True) for _ in range(busy_n)]
    times: dict[str, list[float]] = {name: [] for name in settings}
    try:
        for p in busy:
            plan.for_builds.apply_to(p.pid)
        for _ in range(args.repeats):
            for name, placement in settings.items():
                times[name].append(make_once(spec, placement))
                print(f"  {name}: {times[name][-1]:.1f} s", flush=True)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    result = {"cores": multiprocessing.cpu_count(), "build_cores": len(plan.builds), "busy": busy_n,
              "alone_s": alone, "median_s": {k: statistics.median(v) for k, v in times.items()}, "runs_s": times}
    print(f"\n{'maker':<20}{'median s':>10}{'x alone':>10}")
    for name, median in result["median_s"].items():
        print(f"{name:<20}{median:>10.1f}{median / alone:>10.2f}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
