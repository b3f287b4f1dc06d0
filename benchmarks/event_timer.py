"""A minimal timer, independent of the oracle's: the yardstick of benchmarks/fidelity.py.

    python benchmarks/event_timer.py JOB.json

Times each item of the job in this one fresh process, the simplest way that is still fair: fixed inputs
(one set, seed 101), the model made once (seed 42), full fp32 (no TF32, as the oracle's workers), under
`torch.no_grad()`, `warmup` calls, then `rounds` rounds (default 3) of `calls` calls each between two CUDA
events with the L2 cache flushed before it (a 256 MB buffer zeroed outside the events), one
synchronisation at the end of a round; the lowest round's median (one launch-bound reading on a quiet
H200 came out 1.6x its other runs').
On a CPU: `perf_counter` around each call, torch on every core, no flush. Nothing of the oracle's timing,
worker or protocol code runs here; only its build hooks, so that a candidate's extension is loaded from
the oracle's build cache instead of being compiled again. One JSON line per item on stdout:
{"label", "median_ms", "q1_ms", "q3_ms", "calls", "round_ms"} or {"label", "error"}.

JOB.json: {"device": "cuda"|"cpu", "cache": BUILD_CACHE_DIR, "gpu_arch": "9.0"|null, "calls": 100,
"warmup": 10, "rounds": 3, "items": [{"label": str, "task_code": str, "candidate": PATH|null (null: the task's Model)}]}.
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

FLUSH_BYTES = 256 * 1024 * 1024


def model_for(item: dict, device: str) -> tuple[torch.nn.Module, list]:
    namespace: dict = {"__name__": "timed_task"}
    exec(compile(item["task_code"], item["label"], "exec"), namespace)
    cls = namespace["Model"]
    if item.get("candidate"):
        spec = importlib.util.spec_from_file_location(f"timed_{abs(hash(item['label']))}", item["candidate"])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        cls = module.ModelNew
    torch.manual_seed(42)
    model = cls(*namespace["get_init_inputs"]()).to(device).eval()
    torch.manual_seed(101)
    inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in namespace["get_inputs"]()]
    return model, inputs


def time_item(item: dict, job: dict) -> dict:
    """The item's median over `calls` calls, in each of `rounds` rounds; the lowest round is its time. A
    quiet machine can still slow one round of a launch-bound call (its host issues slower than the GPU
    runs it, and the GPU waits inside the events), never speed one up."""
    device = job["device"]
    model, inputs = model_for(item, device)
    rounds: list[list[float]] = []
    with torch.no_grad():
        for _ in range(job.get("warmup", 10)):
            model(*inputs)
        for _ in range(job.get("rounds", 3)):
            rounds.append(_one_round(model, inputs, device, job["calls"]))
    quartiles = [statistics.quantiles(samples, n=4) for samples in rounds]
    q1, med, q3 = min(quartiles, key=lambda q: q[1])
    return {"label": item["label"], "median_ms": med, "q1_ms": q1, "q3_ms": q3, "calls": len(rounds[0]),
            "round_ms": [q[1] for q in quartiles]}


def _one_round(model: torch.nn.Module, inputs: list, device: str, calls: int) -> list[float]:
    if device != "cuda":
        samples = []
        for _ in range(calls):
            t0 = time.perf_counter()
            model(*inputs)
            samples.append((time.perf_counter() - t0) * 1e3)
        return samples
    flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.float32, device="cuda")
    events = []
    torch.cuda.synchronize()
    for _ in range(calls):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        model(*inputs)
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in events]


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    device = job["device"]
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if device == "cpu":
        torch.set_num_threads(os.cpu_count() or 1)
    from oracle.build import BuildRecord, install_build_hooks

    install_build_hooks(Path(job["cache"]), job.get("gpu_arch"), BuildRecord())
    for item in job["items"]:
        try:
            line = time_item(item, job)
        except Exception as exc:  # noqa: BLE001 - one item's failure is that item's row
            line = {"label": item["label"], "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"}
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
