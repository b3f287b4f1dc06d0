"""Oracle throughput from cold caches: `kernelsearch run` over the candidate corpus, and a peer-style harness.

    python benchmarks/throughput.py [--ours] [--peer N] [--limit N] [--max-input-mb MB] [--out FILE.json]

Ours (`--ours`): every distinct candidate under `benchmarks/candidates/` (CUDA on a GPU, the `*_cpp.py` ones
on a CPU) goes into a replay file, and `kernelsearch run --generator replay:FILE --no-early-stop` judges them
all, end to end (Ray, the oracle pool, the run store), with an empty build cache, baseline cache and
precompiled-header folder. The sizes are the dataset's, fitted to the device as a run fits them (the
default `--max-input-mb`). Reported from the run's `samples.jsonl`: candidates a minute over the run's wall
time, each verdict's device seconds by phase (p50/p95 of their sum), builds, and whether each verdict is the
one its file's first line expects.

Peer (`--peer N`): the first N of the same candidates, judged the way KernelBench's own evaluation script
does it: a 16-process pre-build (each candidate imported once in a pool of spawned processes, building its
extension into a folder of its own), then one candidate after another, each in a freshly spawned process:
reference and candidate models from the same seed, 5 correctness trials on fresh inputs (atol = rtol = 1e-2),
then 100 calls timed one by one with CUDA events. Its candidates a minute, and ours over it, are printed.
The same N candidates are also counted from our run, so the ratio compares equal work.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

from search.store import OracleDevice  # noqa: E402

DATA = [ROOT.parent / ".shared" / "kernelbench" / "kernelbench_levels1-3.jsonl",
        ROOT.parent.parent / "shared" / "kernelbench" / "kernelbench_levels1-3.jsonl"]

PEER = r'''
import faulthandler, json, multiprocessing as mp, os, runpy, signal, sys, time, traceback

# gpu_run.sh asks the processes of a step cut short for their stacks with SIGUSR1: print them, do not die
# (a spawned evaluation re-imports this module, so it registers too)
faulthandler.register(signal.SIGUSR1)

def build(job):
    os.environ["TORCH_EXTENSIONS_DIR"] = job["ext_dir"]
    t0 = time.perf_counter()
    try:
        runpy.run_path(job["path"], run_name="candidate")
        return {"name": job["name"], "build_s": time.perf_counter() - t0}
    except BaseException as exc:
        return {"name": job["name"], "build_s": time.perf_counter() - t0, "error": f"{type(exc).__name__}: {exc}"[:200]}

def evaluate(job, queue):
    import torch
    row = {"name": job["name"]}
    try:
        os.environ["TORCH_EXTENSIONS_DIR"] = job["ext_dir"]
        ns = {}
        exec(compile(job["task_code"], "task", "exec"), ns)
        init = ns["get_init_inputs"]()
        torch.manual_seed(42)
        ref = ns["Model"](*init).cuda()
        cand = runpy.run_path(job["path"], run_name="candidate")
        torch.manual_seed(42)
        new = cand["ModelNew"](*init).cuda()
        ok = True
        with torch.no_grad():
            for trial in range(5):
                torch.manual_seed(trial)
                inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in ns["get_inputs"]()]
                expected, got = ref(*inputs), new(*inputs)
                torch.cuda.synchronize()
                if got.shape != expected.shape or not torch.allclose(expected, got, atol=1e-2, rtol=1e-2):
                    ok = False
                    break
            row["correct"] = ok
            if ok:
                times = []
                for _ in range(100):
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    new(*inputs)
                    end.record()
                    torch.cuda.synchronize()
                    times.append(start.elapsed_time(end))
                row["time_ms"] = sorted(times)[50]
    except BaseException as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"[:200]
    queue.put(row)

if __name__ == "__main__":
    jobs = json.load(open(sys.argv[1]))
    ctx = mp.get_context("spawn")
    t0 = time.perf_counter()
    with ctx.Pool(16) as pool:
        builds = pool.map(build, jobs)
    prebuild_s = time.perf_counter() - t0
    print(f"peer: pre-build of {len(jobs)} in {prebuild_s:.0f} s", file=sys.stderr, flush=True)
    rows = []
    for i, job in enumerate(jobs):
        t1 = time.perf_counter()
        queue = ctx.Queue()
        p = ctx.Process(target=evaluate, args=(job, queue))
        p.start()
        p.join(300)
        row = queue.get() if not queue.empty() else {"name": job["name"], "error": f"exit {p.exitcode}"}
        row["seconds"] = time.perf_counter() - t1
        rows.append(row)
        print(f"peer: {i + 1}/{len(jobs)} at {time.perf_counter() - t0:.0f} s: {json.dumps(row)}", file=sys.stderr, flush=True)
    print(json.dumps({"prebuild_s": prebuild_s, "builds": builds, "rows": rows}))
'''


def expected_status(path: Path) -> str:
    m = re.match(r"#\s*expected verdict:\s*([\w/]+)", path.read_text().splitlines()[0])
    return m.group(1) if m else "?"


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


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def cold_env(cache: Path) -> dict[str, str]:
    return {**os.environ, "KERNELSEARCH_CACHE": str(cache), "KERNELSEARCH_PCH": str(cache / "pch"), "PYTHONUNBUFFERED": "1"}


def write_replay(files: list[tuple[str, Path]], replay: Path) -> tuple[dict[str, tuple[str, Path]], dict[str, int]]:
    """The corpus as a replay file; returns each candidate's expected verdict by source hash, and the
    candidates per task."""
    from oracle.candidate import content_hash
    from oracle.extract import extract

    expected: dict[str, tuple[str, Path]] = {}
    per_task: dict[str, int] = {}
    with replay.open("w") as f:
        for task_id, path in files:
            text = path.read_text()
            found = extract(text, "auto")
            if found.source is not None:
                expected[content_hash(found.source)] = (expected_status(path), path)
            per_task[task_id] = per_task.get(task_id, 0) + 1
            f.write(json.dumps({"task": task_id, "completion": text}) + "\n")
    return expected, per_task


def run_ours(files: list[tuple[str, Path]], source: str, device: str, max_input_mb: float | None, work: Path,
             out: Path | None = None) -> dict:
    replay = work / "corpus.jsonl"
    expected, per_task = write_replay(files, replay)
    out = out or work / "run"
    cmd = [sys.executable, "-m", "search.cli", "run", "--source", source, "--tasks", ",".join(sorted(per_task)),
           "--generator", f"replay:{replay}", "-n", str(max(per_task.values())), "--no-early-stop",
           "--device", device, "--out", str(out)]
    if max_input_mb:
        cmd += ["--max-input-mb", str(max_input_mb)]
    print("  " + " ".join(cmd[1:]), flush=True)
    started = time.time()
    Path(f"{out}.started").write_text(f"{started}\n")  # for `--summarize` of a run cut short
    proc = subprocess.run(cmd, cwd=ROOT.parent, env=cold_env(work / "cache"), capture_output=True, text=True)
    return {"rc": proc.returncode, "stderr_tail": proc.stderr[-3000:], "stdout_tail": proc.stdout[-1500:],
            **summarize(out, expected, started, time.time())}


def summarize(out: Path, expected: dict[str, tuple[str, Path]], started: float, ended: float | None = None) -> dict:
    """Figures of a run folder (one that was cut short too: `ended` None takes its last verdict's time)."""
    from search.store import read_samples

    samples = read_samples(out / "samples.jsonl") if (out / "samples.jsonl").exists() else []
    # the verdict's fields beside the sample's (a duplicate names the sample it repeats)
    records = [{**(r.verdict.to_json() if r.verdict else {}), "task": r.task, "status": r.status, "hash": r.hash,
                "duplicate_of": r.duplicate_of, "recorded_at": r.recorded_at} for r in samples]
    judged = [r for r in records if r.get("duplicate_of") is None and r.get("hash")]
    wall = (ended or max((r.get("recorded_at") or started for r in judged), default=started)) - started
    # a candidate's device time: its phases but `waiting` (for memory, the device lock, the reference process);
    # since a task is prepared beside its first build, its reference and eager timing are in no verdict
    device_s = [sum(v for k, v in (r.get("device_s") or {}).items() if k != "waiting") for r in judged]
    phases: dict[str, list[float]] = {}
    for r in judged:
        for k, v in (r.get("device_s") or {}).items():
            phases.setdefault(k, []).append(v)
    queued: dict[str, list[float]] = {}  # what a candidate waited for in the oracle: a build slot, a device slot
    for r in judged:
        for k, v in (r.get("queued_s") or {}).items():
            queued.setdefault(k, []).append(v)
    verdicts = []
    for r in judged:
        exp, path = expected.get(r["hash"], ("?", None))
        verdicts.append({"task": r["task"], "file": str(path.relative_to(ROOT)) if path else None, "expected": exp,
                         "status": r["status"], "as_expected": r["status"] in exp.split("/"), "message": r["message"][:160],
                         "device_s": r.get("device_s"), "build_s": r.get("build_s"), "time_ms": r.get("time_ms"),
                         "speedup_vs_eager": r.get("speedup_vs_eager"), "speedup_vs_compile": r.get("speedup_vs_compile"),
                         "how_built": ("pch " if r.get("build_pch") else "") + str(r.get("build_header") or ""),
                         "at_s": (r.get("recorded_at") or started) - started})
    builds = [r["build_s"] for r in judged if r.get("build_s")]
    fresh = [r for r in judged if r.get("build_s") and not r.get("build_cached")]
    # how the fresh builds compiled: with the precompiled header or not, and their CUDA sources' header rung
    how_built = {"pch": sum(bool(r.get("build_pch")) for r in fresh), "no_pch": sum(not r.get("build_pch") for r in fresh),
                 "build_p50_pch_s": pct([r["build_s"] for r in fresh if r.get("build_pch")], 0.5),
                 "build_p50_no_pch_s": pct([r["build_s"] for r in fresh if not r.get("build_pch")], 0.5),
                 "headers": {h: sum(r.get("build_header") == h for r in fresh) for h in
                             sorted({str(r.get("build_header")) for r in fresh if r.get("build_header")})}}
    worker_phases: dict[str, list[float]] = {}
    for r in judged:  # where a correct candidate's worker spent its time (samples.jsonl keeps the timing details)
        for k, v in ((r.get("timing") or {}).get("worker_phases") or {}).items():
            worker_phases.setdefault(re.sub(r"\d+", "N", k), []).append(v)
    # the workers that held the most device memory: reserved against allocated (to tensors) and promised
    memory = [{"task": r["task"], **(r.get("timing") or {}).get("worker_memory_mb", {})}
              for r in judged if (r.get("timing") or {}).get("worker_memory_mb")]
    worker_memory_top = sorted(memory, key=lambda m: -(m.get("peak") or 0))[:5]
    config = json.loads((out / "config.json").read_text()) if (out / "config.json").exists() else {}
    # before the first build: the run's own start (tasks, Ray, engine), and when each oracle was ready
    startup = {**config.get("startup_s", {}),
               "oracles_ready_at_s": [round(o["ready_at"] - started, 1) for o in config.get("oracles_started", [])
                                      if o.get("ready_at")],
               "oracle_init_s": [o.get("init_s") for o in config.get("oracles_started", [])],
               # when each oracle was first asked to judge a candidate: its wait, once ready, for work
               "first_evaluate_at_s": [round(d["first_evaluate_at"] - started, 1) for d in config.get("oracles_device") or []
                                       if d.get("first_evaluate_at")],
               "first_verdict_at_s": min((v["at_s"] for v in verdicts), default=None)}
    return {"candidates": len(judged), "wall_s": wall, "per_min": 60 * len(judged) / wall if judged and wall > 0 else 0.0,
            "startup": startup, "tail": tail(out, judged, started), "on_device": on_device(judged, started),
            "oracles_device": [OracleDevice.from_json(d).to_json() for d in config.get("oracles_device") or []],
            "device_s_p50": pct(device_s, 0.5), "device_s_p95": pct(device_s, 0.95),
            "phases_p50": {k: pct(v, 0.5) for k, v in phases.items()}, "phases_sum": {k: sum(v) for k, v in phases.items()},
            "queued_p50": {k: pct(v, 0.5) for k, v in queued.items()}, "queued_p90": {k: pct(v, 0.9) for k, v in queued.items()},
            "worker_phases_p50": {k: pct(v, 0.5) for k, v in worker_phases.items()},
            # timed workers whose checks waited for their profiling warm-up (started for their job, not on standby)
            "warm_up_waits": len(worker_phases.get("warm-up", [])),
            "worker_memory_top_mb": worker_memory_top, "profile": profile_sessions(judged),
            "build_p50_s": pct(builds, 0.5), "build_p90_s": pct(builds, 0.9), "how_built": how_built,
            "as_expected": sum(v["as_expected"] for v in verdicts), "verdicts": verdicts}


def profile_sessions(judged: list[dict]) -> dict:
    """What the CUDA profiling sessions of the timed candidates recorded (`timing.profile_sessions`, each
    [kernels, fillers recorded, fillers launched]): how many candidates needed more than one session, lost a
    filler record (CUPTI's loss at a session's start), or were judged blind (`kernels_unseen`)."""
    lists = [(r.get("timing") or {}).get("profile_sessions") for r in judged]
    lists = [x for x in lists if x]
    return {"profiled": len(lists), "retried": sum(len(x) > 1 for x in lists),
            "sessions_losing_fillers": sum(fillers < launched for x in lists for _, fillers, launched in x),
            "kernels_unseen": sum("kernels_unseen" in (r.get("flags") or []) for r in judged)}


def tail(out: Path, judged: list[dict], started: float) -> dict:
    """What a run did after its last verdict: the best kernels (`best/`; how many were re-timed) and the
    torch.compile baselines it still waited for, with when the last of each came (seconds from the start), and how long
    the re-timings waited for room among the kept references (p50 and most: on an H200 a level-1 task at
    the dataset's sizes fills that share alone, so its re-timings go one at a time)."""
    from search.store import RunStore, read_baselines

    last = max((r.get("recorded_at") or started for r in judged), default=started)
    store = RunStore(out)  # the store's own reader of best/, without `open` (which writes)
    bests = [b for b in (store.best(t) for t in sorted({r["task"] for r in judged})) if b is not None]
    best_at = [b["retimed_at"] for b in bests if b.get("retimed_at")]
    memory_waits = [(b.get("queued_s") or {}).get("reference_memory", 0.0) for b in bests]
    baseline_at = [b.recorded_at for b in read_baselines(out / "baselines.jsonl").values() if b.recorded_at]
    return {"last_verdict_at_s": round(last - started, 1), "bests": len(bests),
            "bests_retimed": sum(b.get("retimed") is not False for b in bests),  # the others kept their verdict
            "last_best_at_s": round(max(best_at) - started, 1) if best_at else None,
            "baselines_after_last_verdict": sum(t > last for t in baseline_at),
            "last_baseline_at_s": round(max(baseline_at) - started, 1) if baseline_at else None,
            "best_reference_memory_wait_s": ([round(pct(memory_waits, 0.5), 1), round(max(memory_waits), 1)]
                                             if memory_waits else None)}


def on_device(judged: list[dict], started: float) -> dict:
    """How many candidates were in their checks or timing at once, from each verdict's end (`recorded_at`) and
    its `verify_s` + `time_s`: the mean over the span from the first such start to the last end, the most at
    any moment, and the share of that span with at most one. A run whose device slots are held by candidates
    waiting before their checks (`queued_s`) shows as one at a time, however many slots it has."""
    spans = sorted((r["recorded_at"] - started - d, r["recorded_at"] - started)
                   for r in judged if r.get("recorded_at") and (d := (r.get("verify_s") or 0) + (r.get("time_s") or 0)) > 0)
    if not spans:
        return {"mean": None, "most": 0, "share_at_most_one": None, "span_s": 0.0}
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans], key=lambda e: (e[0], e[1]))
    begin, end = edges[0][0], edges[-1][0]
    busy = at_most_one = 0.0
    now, count, most = begin, 0, 0
    for at, step in edges:
        busy += count * (at - now)
        at_most_one += (at - now) if count <= 1 else 0.0
        now, count = at, count + step
        most = max(most, count)
    span = end - begin
    return {"mean": round(busy / span, 3) if span > 0 else None, "most": most,
            "share_at_most_one": round(at_most_one / span, 3) if span > 0 else None, "span_s": round(span, 1)}


def run_peer(files: list[tuple[str, Path]], tasks: dict, work: Path) -> dict:
    jobs = [{"name": f"{tid}/{p.stem}", "path": str(p), "task_code": tasks[tid].code,
             "ext_dir": str(work / "peer-ext" / f"{i:03d}")} for i, (tid, p) in enumerate(files) if tid in tasks]
    spec = work / "peer.json"
    spec.write_text(json.dumps(jobs))
    script = work / "peer.py"
    script.write_text(PEER)
    started = time.perf_counter()
    # its progress goes to our stderr as it happens: a run cut short still shows its pre-build and evaluations
    proc = subprocess.run([sys.executable, str(script), str(spec)], stdout=subprocess.PIPE, text=True)
    wall = time.perf_counter() - started
    try:
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"error": f"exit {proc.returncode}, no result (its messages are above)", "wall_s": wall, "candidates": 0,
                "per_min": 0.0}
    rows = result["rows"]
    return {"candidates": len(rows), "wall_s": wall, "per_min": 60 * len(rows) / wall, "prebuild_s": result["prebuild_s"],
            "eval_s_p50": pct([r["seconds"] for r in rows], 0.5), "rows": rows, "builds": result["builds"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", default=next((str(p) for p in DATA if p.exists()), str(DATA[0])))
    ap.add_argument("--ours", action="store_true", help="judge the corpus with kernelsearch run")
    ap.add_argument("--peer", type=int, default=0, help="candidates for the peer-style harness (0: none)")
    ap.add_argument("--limit", type=int, default=None, help="at most this many candidates")
    ap.add_argument("--max-input-mb", type=float, default=None, help="default: what a run uses (1/32 of the GPU)")
    ap.add_argument("--work", type=Path, default=None, help="an empty folder for the caches and the run (default: a new one)")
    ap.add_argument("--run-dir", type=Path, default=None, help="the run's folder (default: WORK/run)")
    ap.add_argument("--summarize", type=Path, default=None, help="only print the figures of this run folder (a run cut short too)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.summarize:
        device = json.loads((args.summarize / "config.json").read_text()).get("device", "cuda")
        expected, _ = write_replay(candidate_files(device), Path(tempfile.mkdtemp()) / "corpus.jsonl")
        started = float(Path(f"{args.summarize}.started").read_text())
        o = summarize(args.summarize, expected, started)
        for v in sorted(o["verdicts"], key=lambda v: v["at_s"]):
            print(f"  {v['at_s']:6.0f} s {v['task']:55s} {Path(v['file'] or '?').stem:18s} {v['status']:14s}"
                  f"{'' if v['as_expected'] else ' (expected ' + v['expected'] + ')'} build {v['build_s'] or 0:.0f} s "
                  f"device {sum((v['device_s'] or {}).values()):.2f} s {v['how_built']}")
        print({k: v for k, v in o.items() if k != "verdicts"})
        print("after the last verdict:", o["tail"])
        return

    import torch

    from tasks import Selection, load_tasks

    device = "cuda" if torch.cuda.is_available() else "cpu"
    work = args.work or Path(tempfile.mkdtemp(prefix="ks-throughput-"))
    work.mkdir(parents=True, exist_ok=True)
    files = candidate_files(device)[: args.limit]
    print(f"{len(files)} distinct candidates for {len({t for t, _ in files})} tasks, device {device}, "
          f"{os.cpu_count()} cores, cold caches under {work}", flush=True)
    report: dict = {"device": device, "cores": os.cpu_count(), "torch": torch.__version__, "files": len(files)}
    if args.ours:
        ours = report["ours"] = run_ours(files, args.source, device, args.max_input_mb, work, args.run_dir)
        for v in ours["verdicts"]:
            print(f"  {v['task']:55s} {Path(v['file'] or '?').stem:18s} {v['status']:14s}"
                  f"{'' if v['as_expected'] else ' (expected ' + v['expected'] + ')'} "
                  f"device {sum((v['device_s'] or {}).values()):.2f} s {v['device_s']}", flush=True)
        if ours["rc"]:
            print(ours["stderr_tail"])
    if args.peer:
        from tasks.fitting import default_budget_mb

        mb = args.max_input_mb or default_budget_mb(device)  # the sizes `kernelsearch run` fits to
        loaded = load_tasks(args.source, Selection(task_ids=frozenset(t for t, _ in files)), mb)
        peer = report["peer"] = run_peer(files[: args.peer], {t.id: t for t in loaded.tasks}, work)
        if "error" in peer:
            print("peer failed:", peer["error"])
    if args.out:
        args.out.write_text(json.dumps(report, indent=1, default=str))
    print()
    if args.ours:
        o = report["ours"]
        print(f"ours: {o['candidates']} candidates in {o['wall_s']:.0f} s = {o['per_min']:.1f} a minute (rc {o['rc']}); "
              f"device s per candidate p50 {o['device_s_p50']}, p95 {o['device_s_p95']}; by phase p50 {o['phases_p50']}; "
              f"build p50 {o['build_p50_s']}, p90 {o['build_p90_s']}; verdicts as expected {o['as_expected']}/{o['candidates']}")
        print(f"worker phases p50 (s): {o['worker_phases_p50']}; waited for their warm-up: {o['warm_up_waits']}")
        print(f"fresh builds: {o['how_built']}")
        print(f"profiling sessions: {o['profile']}")
        print(f"startup: {o['startup']}")
        d = o["on_device"]
        print(f"candidates in their checks or timing at once: mean {d['mean']}, most {d['most']}, at most one "
              f"{d['share_at_most_one']} of the {d['span_s']} s from the first check to the last verdict")
        for od in o.get("oracles_device") or []:  # the oracle's own account, at its last record
            print(f"oracle device: up {od['alive_s']:.0f} s, busy {od['busy_s']:.0f} s, alone {od['exclusive_s']:.0f} s: "
                  + ", ".join(f"{k} {v:.0f} s ({od['exclusive_times'].get(k, 0)}x)" for k, v in od["exclusive_by"].items())
                  + f"; slot phases {od['phases_s']}")
            if od.get("reference_peaks"):  # the reference process's memory, by kind of request
                print("reference process at most, reserved / allocated MB: " + ", ".join(
                    f"{op} {p['reserved_mb']:.0f} / {p['allocated_mb']:.0f}" for op, p in od["reference_peaks"].items()))
        for m in o.get("worker_memory_top_mb") or []:
            print(f"worker memory MB, {m['task']}: peak {m.get('peak')}, allocated {m.get('allocated')}, promised {m.get('promised')}")
    if args.peer and report["peer"].get("candidates"):
        p = report["peer"]
        print(f"peer: {p['candidates']} candidates in {p['wall_s']:.0f} s = {p['per_min']:.2f} a minute "
              f"(pre-build {p['prebuild_s']:.0f} s, evaluation p50 {p['eval_s_p50']:.1f} s a candidate)")
        if args.ours and report["ours"]["per_min"]:
            print(f"ratio ours / peer: {report['ours']['per_min'] / p['per_min']:.1f}x candidates a minute")


if __name__ == "__main__":
    main()
