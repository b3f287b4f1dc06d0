"""Does a launch-bound timing wait for a core while compilers run, and does keeping a core for it help?

    python benchmarks/timing_cores.py [--rounds 2] [--builds N] [--calls 1000] [--ops 50] [--modes ...]

A launch-heavy timing stands in for a launch-bound GPU kernel, in a worker started as the oracle starts
them (`oracle.sandbox.Worker`), each call timed by `perf_counter`, torch single-threaded. Two probes:
`ops`, one Python thread issuing many tiny torch ops (`--ops` relu/mul/add triples on 256 floats a call);
`handoff`, each call handing a fifth of them to a second thread and waiting for it, as a launch and a
synchronize do (two wake-ups a call: what a thread waiting for a core pays on every call). It is timed

- `quiet`: nothing else of ours running;
- `builds`: beside `--builds` cold C++ builds (default: one per core, so that the compilers hold every
  core, as 15 nvcc builds hold 16), everything on every core at the same priority;
- `niced`: the same builds at nice 10, on every core;
- `reserved`: the oracle.cores plan: the timing worker on its kept core, the builds on the others at
  nice 10 (`plan_cores().for_timing` / `.for_builds`, given to the workers as `placement`);
- `stopped`: the builds on every core, stopped (SIGSTOP, every process they started) while the probe
  runs: what the oracle does on a CPU device (see cpu_timing_beside_builds.py).

Modes are interleaved, `--rounds` times, each build cold (a fresh cache and a source no cache has seen).
Printed: the probe's median and mean per call and the median over rounds, with the ratio to quiet; and the
builds' wall time, which is the reservation's cost to build throughput.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

from oracle.cores import Placement, plan_cores  # noqa: E402
from oracle.harness import build_entry  # noqa: E402
from oracle.protocol import send  # noqa: E402
from oracle.sandbox import Worker, _descendants, run_to_result, signal_trees  # noqa: E402

CANDIDATE = ROOT.parent / "tests" / "candidates" / "leaky_correct.py"
MODES = ("quiet", "builds", "niced", "reserved", "stopped")
PROBES = ("ops", "handoff")
COMPILERS = {"cc1plus", "cicc", "cudafe++", "ptxas"}


def probe_entry(conn: Connection, job_dir: str) -> None:
    """In a worker: time `calls` calls two ways, report per-call figures of each and where it ran.

    `ops`: one thread runs `ops` tiny op triples per call, as a host thread launches kernels.
    `handoff`: each call hands its (five times fewer) triples to a second thread and waits for it, as a
    launch and a synchronize do: every call then needs two wake-ups, and pays for every wait for a core."""
    import queue

    import torch

    job = json.loads((Path(job_dir) / "job.json").read_text())
    torch.set_num_threads(1)
    x = torch.randn(256)

    def work(n: int) -> torch.Tensor:
        y = x
        for _ in range(n):
            y = torch.relu(y * 1.0001 + 0.5)
        return y

    requests: queue.SimpleQueue = queue.SimpleQueue()
    done: queue.SimpleQueue = queue.SimpleQueue()

    def device() -> None:
        while (n := requests.get()) is not None:
            done.put(work(n))

    helper = threading.Thread(target=device, daemon=True)
    helper.start()

    def handoff() -> None:
        requests.put(max(1, job["ops"] // 5))
        done.get()

    result = {"cores": sorted(os.sched_getaffinity(0)), "nice": os.getpriority(os.PRIO_PROCESS, 0)}
    for name, call in (("ops", lambda: work(job["ops"])), ("handoff", handoff)):
        for _ in range(50):
            call()
        samples = []
        for _ in range(job["calls"]):
            t0 = time.perf_counter()
            call()
            samples.append((time.perf_counter() - t0) * 1e3)
        samples.sort()
        result[name] = {"median_ms": statistics.median(samples), "mean_ms": statistics.fmean(samples),
                        "p90_ms": samples[int(0.9 * len(samples))]}
    requests.put(None)
    send(conn, result=result)


@dataclass
class Builds:
    """Cold C++ builds running in workers, each in a thread of ours; their wall time when all are done."""

    workers: list[Worker] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    ok: list[bool] = field(default_factory=list)

    @classmethod
    def start(cls, n: int, cache: Path, placement: Placement | None, nonce: str) -> "Builds":
        builds = cls()
        source = CANDIDATE.read_text()
        for i in range(n):
            text = source.replace("#include <torch/extension.h>", f"#include <torch/extension.h>\n// {nonce} {i}", 1)
            job = {"cache": str(cache / "builds"), "gpu_arch": None, "candidate_path": "candidate.py", "pch": None,
                   "backend": "cpp", "build_timeout_s": 1800, "max_file_bytes": 2 * 1024**3}
            worker = Worker(build_entry, job, {"candidate.py": text}, env={"CUDA_VISIBLE_DEVICES": ""},
                            placement=placement)
            thread = threading.Thread(target=builds._run, args=(worker,))
            builds.workers.append(worker)
            builds.threads.append(thread)
            thread.start()
        return builds

    def _run(self, worker: Worker) -> None:
        outcome = run_to_result(worker)
        self.seconds.append(outcome.elapsed_s)
        self.ok.append(bool(outcome.result and outcome.result.get("error_kind") is None))

    def compilers(self) -> int:
        found = 0
        for w in self.workers:
            for pid in _descendants(w.process.pid):
                try:
                    found += Path(f"/proc/{pid}/comm").read_text().strip() in COMPILERS
                except OSError:
                    pass
        return found

    def wait_for_compilers(self, timeout_s: float = 180) -> int:
        deadline = time.monotonic() + timeout_s
        while self.compilers() < len(self.workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        return self.compilers()

    def join(self) -> float:
        for t in self.threads:
            t.join()
        return max(self.seconds) if self.seconds else 0.0


def probe(calls: int, ops: int, placement: Placement | None) -> dict:
    this = importlib.import_module("benchmarks.timing_cores")  # by that name, so a worker can import the entry
    worker = Worker(this.probe_entry, {"calls": calls, "ops": ops}, placement=placement)
    outcome = run_to_result(worker)
    if outcome.result is None:
        raise SystemExit(f"the timing probe failed: {outcome.crashed or outcome.timed_out_phase}: {outcome.stderr_tail}")
    return outcome.result


def run_mode(mode: str, args, cache: Path, nonce: str) -> dict:
    plan = plan_cores()
    builds = None
    timing_at = None
    if mode != "quiet":
        placement = {"builds": None, "niced": Placement(None, plan.build_nice), "reserved": plan.for_builds,
                     "stopped": None}[mode]
        builds = Builds.start(args.builds, cache, placement, nonce)
    try:
        running = builds.wait_for_compilers() if builds else 0
        if builds and running == 0:
            raise SystemExit("no compiler seen: nothing to measure beside")
        if mode == "reserved":
            timing_at = plan.for_timing
        if mode == "stopped":
            signal_trees([w.process.pid for w in builds.workers], signal.SIGSTOP)
        try:
            result = probe(args.calls, args.ops, timing_at)
        finally:
            if mode == "stopped":
                signal_trees([w.process.pid for w in builds.workers], signal.SIGCONT)
        result["load"] = os.getloadavg()[0]
        if builds is not None:
            result["compilers"] = running
            result["build_s"] = builds.join()
            result["builds_ok"] = all(builds.ok)
        return result
    finally:
        if builds is not None:  # cut short (an error, Ctrl-C, SIGTERM): no compiler outlives the run
            for w in builds.workers:
                w.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--builds", type=int, default=len(os.sched_getaffinity(0)), help="cold C++ builds at once")
    ap.add_argument("--calls", type=int, default=1000, help="timed calls per probe")
    ap.add_argument("--ops", type=int, default=50, help="tiny op triples per call")
    ap.add_argument("--modes", default=",".join(MODES), help=f"some of {','.join(MODES)}")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped"))  # so that the builds are closed on the way out
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        sys.exit(f"error: unknown mode(s) {', '.join(unknown)}; choose from {', '.join(MODES)}")
    plan = plan_cores()
    print(f"cores {sorted(os.sched_getaffinity(0))}; {plan.describe()}; {args.builds} builds; "
          f"probe {args.calls} calls of {args.ops} op triples", flush=True)
    results: dict[str, list[dict]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for m in modes:
                res = run_mode(m, args, Path(tmp) / f"{r}-{m}", f"round {r} {m} {time.time()}")
                results[m].append(res)
                extra = (f", {res['compilers']} compilers, builds {res['build_s']:.0f} s"
                         f"{'' if res['builds_ok'] else ' (a build failed)'}") if "build_s" in res else ""
                figures = "; ".join(f"{p} median {res[p]['median_ms']:.3f} ms (mean {res[p]['mean_ms']:.3f}, "
                                    f"p90 {res[p]['p90_ms']:.3f})" for p in PROBES)
                print(f"round {r + 1} {m:9s} {figures}; on cores {res['cores']} nice {res['nice']}; "
                      f"load {res['load']:.1f}{extra}", flush=True)
    print(f"\nmedian over {args.rounds} rounds (x quiet: the probe's median over quiet's)")
    print(f"{'mode':10s} " + " ".join(f"{p + ' median':>15s} {'x quiet':>7s} {p + ' p90':>12s}" for p in PROBES)
          + f" {'build s':>8s}")
    for m in modes:
        rs = results[m]
        cells = []
        for p in PROBES:
            med = statistics.median(r[p]["median_ms"] for r in rs)
            base = statistics.median(r[p]["median_ms"] for r in results["quiet"]) if results.get("quiet") else None
            cells.append(f"{med:15.3f} {(f'{med / base:.2f}' if base else '-'):>7s} "
                         f"{statistics.median(r[p]['p90_ms'] for r in rs):12.3f}")
        build = f"{statistics.median(r['build_s'] for r in rs):.0f}" if "build_s" in rs[0] else "-"
        print(f"{m:10s} " + " ".join(cells) + f" {build:>8s}")


if __name__ == "__main__":
    main()
