"""The search engine over recorded candidates: replay generator, Ray, one oracle actor per GPU.

    python benchmarks/engine_gpu.py [--device cuda] [--gpus 1] [--max-input-mb 128] [--out DIR]

Every file under `benchmarks/candidates/levelN/<task>/` becomes a recorded completion for its task, and
the engine runs with n = that task's number of files and no early stop, so each candidate is drawn once
(in a seeded order) and judged through the whole engine: generator actor, controller, oracle pool, store.
Prints samples per minute, the oracles' device-busy fraction, and the verdicts against those expected.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

from search.controller import SearchPlan  # noqa: E402
from search.runner import RunSettings, build_engine, make_config, run_search, start_ray  # noqa: E402
from search.store import RunStore  # noqa: E402
from tasks import Selection, load_tasks  # noqa: E402

DATA = [ROOT.parent / ".shared" / "kernelbench" / "kernelbench_levels1-3.jsonl",
        ROOT.parent.parent / "shared" / "kernelbench" / "kernelbench_levels1-3.jsonl"]


def write_replay(folder: Path, device: str, path: Path, level: int | None) -> dict[str, list[str]]:
    """Recorded completions, one per candidate file; returns each task's expected statuses."""
    expected: dict[str, list[str]] = collections.defaultdict(list)
    with open(path, "w") as f:
        for file in sorted(folder.glob("level*/*/*.py")):
            if (device == "cpu") != file.stem.endswith("_cpp"):
                continue
            if level is not None and file.parent.parent.name != f"level{level}":
                continue
            task_id = f"{file.parent.parent.name}/{file.parent.name}"
            text = file.read_text()
            m = re.match(r"#\s*expected verdict:\s*([\w/]+)", text.splitlines()[0])
            expected[task_id].append(m.group(1) if m else "?")
            f.write(json.dumps({"task": task_id, "completion": f"```python\n{text}\n```", "file": file.name}) + "\n")
    return expected


async def main_async(args: argparse.Namespace) -> None:
    out = Path(args.out or tempfile.mkdtemp(prefix="ks-engine-"))
    replay = out.parent / f"{out.name}-replay.jsonl"
    expected = write_replay(Path(args.candidates), args.device, replay, args.level)
    loaded = load_tasks(args.source, Selection(task_ids=frozenset(expected)), args.max_input_mb)
    n = max(len(v) for v in expected.values())
    settings = RunSettings(generator=f"replay:{replay}", strategy="zero-shot", device=args.device, gpus=args.gpus,
                           plan=SearchPlan(n=n, early_stop=False, seed=0), max_input_mb=args.max_input_mb,
                           compile_baseline=not args.no_compile_baseline)
    t0 = time.perf_counter()
    resources = start_ray(None, args.device)
    ray_s = time.perf_counter() - t0
    store = RunStore.create(out, make_config(settings, loaded.tasks, {}, resources))
    engine = await build_engine(settings)
    t1 = time.perf_counter()
    def progress(record) -> None:  # one line a sample (a SampleRecord), so a cut-off run still shows where it got
        print(f"  [{time.perf_counter() - t1:6.1f} s] {record.task} sample {record.chain}: {record.status}"
              f"{' (duplicate)' if record.duplicate_of is not None else ''}", flush=True)

    print(f"{len(loaded.tasks)} tasks, n={n}, Ray up in {ray_s:.1f} s; judging...", flush=True)
    await run_search(settings, loaded.tasks, store, on_record=progress, engine=engine)
    wall = time.perf_counter() - t1
    stats = await engine.pool.stats()
    rows = store.samples()
    judged = [r for r in rows if r.duplicate_of is None]
    counts = collections.Counter(r.status for r in judged)
    busy = sum(s.get("device_busy_s", 0) for s in stats)
    print(f"\nengine run on {args.device}: {len(loaded.tasks)} tasks, {len(rows)} samples "
          f"({len(judged)} distinct candidates, {len(rows) - len(judged)} duplicates), {len(stats)} oracle(s), "
          f"{engine.pool.build_slots} build slots each; Ray started in {ray_s:.1f} s")
    print(f"wall {wall:.0f} s; {60 * len(rows) / wall:.1f} samples/min, {60 * len(judged) / wall:.1f} distinct candidates/min")
    print(f"device busy (timing slot held) {busy:.0f} s = {100 * busy / (wall * len(stats)):.0f}% of the wall time; "
          f"build time {sum(s.get('build_s', 0) for s in stats):.0f} s summed over slots")
    print("statuses:", dict(counts))
    first = {}
    for r in rows:
        first.setdefault((r.task, r.hash), r)
    mismatched = 0
    for task_id, exp in sorted(expected.items()):
        got = sorted(r.status for r in rows if r.task == task_id)
        want = sorted(e.split("/")[0] for e in exp)
        ok = got == want or len(got) == len(want) and all(g in e.split("/") for g, e in zip(got, sorted(exp)))
        mismatched += not ok
        best = store.best(task_id) or {}
        print(f"  {task_id:60s} samples {len(got)}  {'ok' if ok else 'MISMATCH ' + str(got) + ' vs ' + str(want)}"
              f"  best {best.get('speedup_vs_eager') or 0:.2f}x eager (re-timed)")
    print(f"tasks whose verdicts match the expected ones: {len(expected) - mismatched} of {len(expected)}; run folder {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--gpus", type=int, default=None)
    ap.add_argument("--source", default=next((str(p) for p in DATA if p.exists()), str(DATA[0])))
    ap.add_argument("--candidates", default=str(ROOT / "candidates"))
    ap.add_argument("--max-input-mb", type=float, default=128)
    ap.add_argument("--level", type=int, help="only the candidates of this level")
    ap.add_argument("--no-compile-baseline", action="store_true", help="skip the torch.compile baselines")
    ap.add_argument("--out")
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
