"""On a CPU, does a build running beside a timing change the time? Eager PyTorch timed three ways.

    python benchmarks/cpu_timing_beside_builds.py [--task builtin/1_LeakyReLU_Scale] [--repeats 3]

The oracle times a task's eager baseline (its trusted reference path, holding the device alone) while
nothing else runs, while a cold C++ build of a candidate runs beside it, and while such a build runs but
is stopped for the timing (`OracleConfig.stop_builds_while_timing`, the default). The three are interleaved,
`--repeats` rounds, each build cold (a fresh cache and a source no cache has seen); medians of the eager
median, and their ratio to the quiet one, are printed. On a GPU the question does not arise: the compilers
use the CPU, the timing the GPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

from oracle import Oracle, OracleConfig  # noqa: E402
from oracle.sandbox import _descendants  # noqa: E402
from tasks import Selection, load_tasks  # noqa: E402

CANDIDATE = ROOT.parent / "tests" / "candidates" / "leaky_correct.py"


def compiler_running(oracle: Oracle) -> bool:
    for worker in list(oracle.quiet._builders):
        for pid in _descendants(worker.process.pid):
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == "cc1plus":
                    return True
            except OSError:
                pass
    return False


def eager_ms(task, cache: Path, mode: str, nonce: str) -> float:
    """The eager median of one timing under `mode`: quiet, builds running, builds stopped."""
    oracle = Oracle(OracleConfig(device="cpu", cache_dir=cache, precompiled_headers=False,
                                 stop_builds_while_timing=mode != "builds running"))
    with ThreadPoolExecutor(1) as pool:
        build = None
        if mode != "quiet":
            source = CANDIDATE.read_text().replace("#include <torch/extension.h>", f"#include <torch/extension.h>\n// {nonce}", 1)
            build = pool.submit(oracle.build, oracle.extract(task, source))
            deadline = time.monotonic() + 120
            while not compiler_running(oracle) and time.monotonic() < deadline and not build.done():
                time.sleep(0.1)
            if not compiler_running(oracle):
                raise SystemExit("the build ended before a compiler was seen: nothing to measure beside")
        ms = oracle.references.retime_eager(task).eager["median_ms"]
        if build is not None:
            build.result()
    return ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="builtin/1_LeakyReLU_Scale")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    task = load_tasks("builtin", Selection(task_ids=frozenset({args.task})), 256).tasks[0]
    modes = ["quiet", "builds running", "builds stopped"]
    times: dict[str, list[float]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for m in modes:
                ms = eager_ms(task, Path(tmp) / f"{r}-{m.replace(' ', '-')}", m, f"round {r} {m} {time.time()}")
                times[m].append(ms)
                print(f"round {r + 1}: {m:15s} eager median {ms:.3f} ms", flush=True)
    quiet = statistics.median(times["quiet"])
    print(f"\n{args.task}, eager PyTorch on this CPU (median of {args.repeats} rounds):")
    for m in modes:
        med = statistics.median(times[m])
        print(f"  {m:15s} {med:8.3f} ms  x{med / quiet:.2f} of quiet   ({', '.join(f'{t:.3f}' for t in times[m])})")


if __name__ == "__main__":
    main()
