"""Oracle throughput on one node from a cold cache, against a plain one-at-a-time harness, side by side.

    python benchmarks/throughput.py [--oracles K] [--baseline N] [--max-input-mb 128] [--out FILE.json]

Ours: every distinct candidate under `benchmarks/candidates/` (CUDA on a GPU, the `*_cpp.py` ones on a CPU) is
handed at once to the engine's oracle pool (Ray actors, one per GPU, each with CPU build slots and one
timing slot) with an empty build cache and no precompiled header: the first build asks for the header and
the builds after it use it, as in a fresh search. Reported: candidates per minute over the whole run,
build p50/p90, the device's seconds per candidate (the overhead outside building: worker start, checks,
timing; checks of several candidates overlap, timing holds the device alone) and how busy it was over the
run, and the GPU's utilisation while work was queued (nvidia-smi, sampled every 0.5 s).

Plain: the first N of the same candidates evaluated one after another in one process the way simple
harnesses do it: `load_inline` builds each as written into an empty folder, one output is compared with
the reference, then 100 calls are timed with CUDA events (wall clock on a CPU). Its candidates per minute,
and the ratio of ours to it, are printed last.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

from tasks import Selection, load_tasks  # noqa: E402

DATA = [ROOT.parent / ".shared" / "kernelbench" / "kernelbench_levels1-3.jsonl",
        ROOT.parent.parent / "shared" / "kernelbench" / "kernelbench_levels1-3.jsonl"]

PLAIN_HARNESS = r"""
import json, os, runpy, sys, tempfile, time
import torch
jobs = json.load(open(sys.argv[1]))
dev = jobs["device"]
out = []
for job in jobs["items"]:
    t0 = time.perf_counter()
    row = {"candidate": job["name"]}
    try:
        ns = {}
        exec(compile(job["task_code"], "task", "exec"), ns)
        torch.manual_seed(42)
        ref = ns["Model"](*ns["get_init_inputs"]()).to(dev)
        os.environ["TORCH_EXTENSIONS_DIR"] = tempfile.mkdtemp(prefix="plain-ext-")
        tb = time.perf_counter()
        cand_ns = runpy.run_path(job["path"], run_name="candidate")
        row["build_s"] = time.perf_counter() - tb
        torch.manual_seed(42)
        new = cand_ns["ModelNew"](*ns["get_init_inputs"]()).to(dev)
        torch.manual_seed(0)
        inputs = [x.to(dev) if isinstance(x, torch.Tensor) else x for x in ns["get_inputs"]()]
        with torch.no_grad():
            expected, got = ref(*inputs), new(*inputs)
            row["correct"] = bool(torch.allclose(expected, got, atol=1e-2, rtol=1e-2))
            if dev == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize(); start.record()
                for _ in range(100):
                    new(*inputs)
                end.record(); torch.cuda.synchronize()
                row["time_ms"] = start.elapsed_time(end) / 100
            else:
                tt = time.perf_counter()
                for _ in range(100):
                    new(*inputs)
                row["time_ms"] = (time.perf_counter() - tt) * 10
    except BaseException as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"[:200]
    row["seconds"] = time.perf_counter() - t0
    out.append(row)
    print(json.dumps(row), flush=True)
"""


def candidate_files(device: str) -> list[tuple[str, Path]]:
    seen, out = set(), []
    for f in sorted((ROOT / "candidates").glob("level*/*/*.py")):
        if (device == "cpu") != f.stem.endswith("_cpp"):
            continue
        text = f.read_text()
        if text not in seen:
            seen.add(text)
            out.append((f"{f.parent.parent.name}/{f.parent.name}", f))
    return out


class GpuSampler:
    """nvidia-smi's utilization.gpu every 0.5 s, in a thread, until stopped."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True, timeout=5).stdout
                self.samples.append(statistics.mean(float(x) for x in out.split()))
            except (OSError, subprocess.SubprocessError, ValueError, statistics.StatisticsError):
                pass
            self._stop.wait(0.5)

    def __enter__(self) -> "GpuSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def run_ours(tasks: dict, files: list[tuple[str, Path]], device: str, oracles: int) -> dict:
    import ray

    from oracle import OracleConfig
    from oracle.candidate import Candidate
    from oracle.extract import extract
    from search.pool import OraclePool, PoolSpec

    pool = OraclePool(PoolSpec(device=device, oracles=oracles), OracleConfig(device=device, call_timeout_s=20))
    await asyncio.gather(*(a.stats.remote() for a in pool.actors))  # actors up before the clock starts
    jobs = []
    for task_id, path in files:
        found = extract(path.read_text(), "auto")
        if found.source is not None and task_id in tasks:
            jobs.append((path, tasks[task_id], Candidate.make(task_id, found.source, found.backend or "torch")))
    done: list[tuple[Path, object, float]] = []
    started = time.perf_counter()

    async def one(path, task, candidate):
        verdict = await pool.evaluate(task, candidate)
        done.append((path, verdict, time.perf_counter() - started))
        print(f"  [{len(done)}/{len(jobs)}] {time.perf_counter() - started:6.0f} s  {task.id} {path.stem}: "
              f"{verdict.status} (build {verdict.build_s or 0:.0f} s) {verdict.message[:80]}", flush=True)

    with GpuSampler() as sampler:
        await asyncio.gather(*(one(*job) for job in jobs))
    wall = time.perf_counter() - started
    stats = await pool.stats()
    for actor in pool.actors:
        ray.kill(actor)
    builds = [v.build_s for _, v, _ in done if v.build_s and not v.build_cached]
    busy_s = sum(s.get("device_busy_s", 0.0) for s in stats)  # anything on the device (checks overlap)
    alone_s = sum(s.get("device_exclusive_s", 0.0) for s in stats)  # timing, holding the device alone
    return {"candidates": len(done), "wall_s": wall, "per_min": 60 * len(done) / wall,
            "build_p50_s": pct(builds, 0.5) if builds else None, "build_p90_s": pct(builds, 0.9) if builds else None,
            "device_s_per_candidate": busy_s / max(1, len(done)), "timed_alone_s_per_candidate": alone_s / max(1, len(done)),
            "device_busy": busy_s / (wall * oracles),
            "gpu_util_mean": statistics.mean(sampler.samples) if sampler.samples else None,
            "statuses": {s: sum(1 for _, v, _ in done if v.status == s) for s in sorted({v.status for _, v, _ in done})},
            "verdicts": [{"file": str(p.relative_to(ROOT)), **v.to_json()} for p, v, _ in done]}


def run_plain(tasks: dict, files: list[tuple[str, Path]], device: str, limit: int) -> dict:
    items = [{"name": f"{tid}/{p.stem}", "path": str(p), "task_code": tasks[tid].code}
             for tid, p in files if tid in tasks][:limit]
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "jobs.json"
        spec.write_text(json.dumps({"device": device, "items": items}))
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", PLAIN_HARNESS, str(spec)], capture_output=True, text=True)
        wall = time.perf_counter() - started
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    for row in rows:
        print(f"  plain {row['candidate']}: {row.get('error') or ('correct' if row.get('correct') else 'incorrect')} "
              f"(build {row.get('build_s', 0):.0f} s)", flush=True)
    return {"candidates": len(rows), "wall_s": wall, "per_min": 60 * len(rows) / wall if rows else None,
            "build_p50_s": statistics.median(r["build_s"] for r in rows if "build_s" in r) if rows else None,
            "rows": rows, "stderr_tail": proc.stderr[-2000:] if proc.returncode else ""}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", default=next((str(p) for p in DATA if p.exists()), str(DATA[0])))
    ap.add_argument("--oracles", type=int, default=1, help="GPU oracles (one per GPU)")
    ap.add_argument("--baseline", type=int, default=6, help="candidates for the one-at-a-time plain harness (0: none)")
    ap.add_argument("--limit", type=int, default=None, help="at most this many candidates")
    ap.add_argument("--max-input-mb", type=float, default=128)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    import ray
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    cache = Path(tempfile.mkdtemp(prefix="ks-throughput-"))
    os.environ["KERNELSEARCH_CACHE"] = str(cache)  # cold: builds, baselines and the precompiled header
    os.environ["KERNELSEARCH_PCH"] = str(cache / "pch")
    files = candidate_files(device)[: args.limit]
    loaded = load_tasks(args.source, Selection(task_ids=frozenset(t for t, _ in files)), args.max_input_mb)
    tasks = {t.id: t for t in loaded.tasks}
    print(f"{len(files)} distinct candidates for {len(tasks)} tasks, device {device}, {os.cpu_count()} cores, "
          f"{args.oracles} oracle(s), cold cache {cache}", flush=True)
    ray.init(num_cpus=os.cpu_count(), num_gpus=torch.cuda.device_count(), include_dashboard=False,
             runtime_env={"env_vars": {"KERNELSEARCH_CACHE": str(cache), "KERNELSEARCH_PCH": str(cache / "pch")}})
    ours = asyncio.run(run_ours(tasks, files, device, args.oracles))
    ray.shutdown()
    plain = run_plain(tasks, files, device, args.baseline) if args.baseline else None

    print(f"\nours: {ours['candidates']} candidates in {ours['wall_s']:.0f} s = {ours['per_min']:.1f} a minute; "
          f"build p50 {ours['build_p50_s'] or 0:.1f} s, p90 {ours['build_p90_s'] or 0:.1f} s; "
          f"device {ours['device_s_per_candidate']:.1f} s a candidate (of which timed alone "
          f"{ours['timed_alone_s_per_candidate']:.1f} s), busy {100 * ours['device_busy']:.0f}% of the run; GPU utilisation {'-' if ours['gpu_util_mean'] is None else '%.0f%%' % ours['gpu_util_mean']}; "
          f"verdicts {ours['statuses']}")
    if plain and plain["per_min"]:
        print(f"plain one-at-a-time: {plain['candidates']} candidates in {plain['wall_s']:.0f} s = "
              f"{plain['per_min']:.2f} a minute (build p50 {plain['build_p50_s'] or 0:.1f} s)")
        print(f"ratio ours / plain: {ours['per_min'] / plain['per_min']:.1f}x candidates a minute")
    if args.out:
        args.out.write_text(json.dumps({"ours": ours, "plain": plain, "device": device, "cores": os.cpu_count(),
                                        "torch": torch.__version__}, indent=1))


if __name__ == "__main__":
    main()
