"""Where a fresh process's first CUDA profiling session spends its seconds, and what a lighter session costs.

    python benchmarks/profiler_start.py [--repeats 3] [--busy 0] [--out FILE.json]

Every candidate's worker profiles one call (`oracle.harness._profile_call_timed`) to name the kernels that
ran. The profiler's first start in a process took 3.7 s on an H200 (`profiler_cost.py`), and on a busy run
the workers' `profile` phase took 0.8-6 s where a warmed one takes 0.01-0.08 s. Each variant runs in a
fresh process, `--repeats` times, with CUDA set up and one call made first:
- `profile`: two sessions of `torch.profiler.profile` as the worker opens them, each split into import,
  enter (Kineto prepared and started), the body, exit (stopped, events collected) and `events()`, with the
  process's CPU seconds beside the wall seconds (CPU close to wall: the cores are what it waits for);
- `kineto`: the same two sessions through the profiler's own bindings (`_prepare_profiler`,
  `_enable_profiler`, `_disable_profiler`), which skip the Python event tree;
- `cprofile` (once): the first `profile` session under cProfile, its 15 costliest functions.
`--busy N` keeps N processes spinning on the host meanwhile, as the builds of a run do.
Prints the medians (s) as a short table last.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import multiprocessing
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _since(start: tuple[float, float]) -> tuple[float, float]:
    wall, cpu = _clock()
    return wall - start[0], cpu - start[1]


def _profile_session(fn, x) -> dict[str, float]:
    from oracle import profiler_head

    figures: dict[str, float] = {}
    t = _clock()
    from torch.profiler import ProfilerActivity, profile

    figures["import_s"], figures["import_cpu_s"] = _since(t)
    t = _clock()
    prof = profile(activities=[ProfilerActivity.CUDA])
    prof.__enter__()
    figures["enter_s"], figures["enter_cpu_s"] = _since(t)
    t = _clock()
    profiler_head.lead_with_fillers()
    fn(x)
    _sync()
    figures["body_s"], _ = _since(t)
    t = _clock()
    prof.__exit__(None, None, None)
    figures["exit_s"], figures["exit_cpu_s"] = _since(t)
    t = _clock()
    names = {e.name for e in prof.events() if "cuda" in str(getattr(e, "device_type", "")).lower()}
    figures["events_s"], _ = _since(t)
    figures["kernels_seen"] = float(len([n for n in names if not profiler_head.is_filler(n)]))
    return figures


def _kineto_session(fn, x) -> dict[str, float]:
    import torch
    from torch._C._profiler import ProfilerActivity, ProfilerConfig, ProfilerState, _ExperimentalConfig

    from oracle import profiler_head

    figures: dict[str, float] = {}
    config = ProfilerConfig(ProfilerState.KINETO, False, False, False, False, False, _ExperimentalConfig())
    activities = {ProfilerActivity.CUDA}
    t = _clock()
    torch._C._autograd._prepare_profiler(config, activities)
    torch._C._autograd._enable_profiler(config, activities)
    figures["enter_s"], figures["enter_cpu_s"] = _since(t)
    t = _clock()
    profiler_head.lead_with_fillers()
    fn(x)
    _sync()
    figures["body_s"], _ = _since(t)
    t = _clock()
    result = torch._C._autograd._disable_profiler()
    figures["exit_s"], figures["exit_cpu_s"] = _since(t)
    t = _clock()
    names = {e.name() for e in result.events() if "cuda" in str(e.device_type()).lower()}
    figures["events_s"], _ = _since(t)
    figures["kernels_seen"] = float(len([n for n in names if not profiler_head.is_filler(n)]))
    return figures


def _sync() -> None:
    import torch

    torch.cuda.synchronize()


def _one(variant: str) -> dict[str, object]:
    import torch

    x = torch.randn(1 << 20, device="cuda")
    fn = torch.nn.ReLU()
    fn(x)
    _sync()
    if variant == "cprofile":
        profiler = cProfile.Profile()
        t = time.perf_counter()
        profiler.enable()
        _profile_session(fn, x)
        profiler.disable()
        wall = time.perf_counter() - t
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(15)
        return {"wall_s": wall, "top": text.getvalue()[-6000:]}
    session = _profile_session if variant == "profile" else _kineto_session
    first = session(fn, x)
    second = session(fn, x)
    return {**{f"1st {k}": v for k, v in first.items()}, **{f"2nd {k}": v for k, v in second.items()}}


def _spin(stop) -> None:
    while not stop.is_set():
        sum(range(10000))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--busy", type=int, default=0, help="host processes kept spinning meanwhile")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--one", choices=["profile", "kineto", "cprofile"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(_one(args.one)))
        return
    stop = multiprocessing.Event()
    spinners = [multiprocessing.Process(target=_spin, args=(stop,), daemon=True) for _ in range(args.busy)]
    for p in spinners:
        p.start()
    rows: dict[str, list[dict]] = {"profile": [], "kineto": []}
    top = ""
    try:
        for r in range(args.repeats):
            for variant in [*rows, *(["cprofile"] if r == 0 else [])]:
                t = time.perf_counter()
                proc = subprocess.run([sys.executable, __file__, "--one", variant], capture_output=True, text=True,
                                      timeout=300)
                if proc.returncode:
                    print(f"{variant}: failed: {proc.stderr.strip().splitlines()[-1:]}")
                    continue
                found = json.loads(proc.stdout.strip().splitlines()[-1])
                if variant == "cprofile":
                    top = f"first session under cProfile: {found['wall_s']:.2f} s\n{found['top']}"
                    continue
                rows[variant].append({**found, "process_s": time.perf_counter() - t})
    finally:
        stop.set()
        for p in spinners:
            p.join(5)
    table = {v: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for v, runs in rows.items() if runs}
    if args.out:
        args.out.write_text(json.dumps({"busy": args.busy, "rows": rows, "medians": table, "cprofile": top}, indent=1))
    print(top)
    keys = sorted({k for m in table.values() for k in m}, key=lambda k: (not k.startswith("1st"), k))
    print(f"medians of {args.repeats}, {args.busy} busy host processes (s)")
    print(f"{'':24}" + "".join(f"{v:>10}" for v in table))
    for k in keys:
        print(f"{k:24}" + "".join(f"{table[v].get(k, float('nan')):10.3f}" for v in table))


if __name__ == "__main__":
    main()
