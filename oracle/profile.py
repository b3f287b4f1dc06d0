"""Profile a task's reference on the oracle's device: where the time goes, and what bounds each operator.

`profile_entry` runs in a trusted worker process (the task's own code only, never a candidate's), like the
reference worker of `oracle.evaluate`. Per aten operator it reports its share of the reference's time
(`torch.profiler`), its FLOPs (`torch.utils.flop_counter`: GEMM, convolution and attention; elementwise and
reduction operators count as zero), the bytes it reads and writes (its tensor arguments and results), and
whether it is memory- or compute-bound: arithmetic intensity (FLOP/byte) against the device's ridge point.
`profile_task` is the trusted side: it starts the worker and returns the profile as JSON.
"""

from __future__ import annotations

import traceback
from collections import defaultdict
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch

# FLOP/byte where the roofline turns: H200 fp32 is about 67 TFLOP/s over 4.8 TB/s (~14); a CPU ~10.
RIDGE = {"cuda": 15.0, "cpu": 10.0}
# Operators served by a vendor library (cuBLAS/cuDNN, MKL/oneDNN): worth keeping unless asked otherwise.
LIBRARY_OPS = {
    f"aten::{n}" for n in (
        "mm addmm bmm baddbmm matmul linear _addmm_activation convolution _convolution conv1d conv2d conv3d "
        "cudnn_convolution mkldnn_convolution convolution_overrideable _convolution_mode conv_transpose2d "
        "_scaled_dot_product_flash_attention _scaled_dot_product_efficient_attention "
        "_scaled_dot_product_cudnn_attention _scaled_dot_product_flash_attention_for_cpu scaled_dot_product_attention"
    ).split()
}


def profile_entry(conn: Connection, job_dir: str) -> None:
    """Worker entry: profile the reference of `job["code"]`; sends one `result` (the profile, or an error)."""
    from oracle import harness
    from oracle.protocol import send
    from tasks.runtime import one_line

    job = harness._enter_worker(Path(job_dir))
    try:
        harness._device_setup(job["device"])
        send(conn, phase="profile", deadline_s=job.get("timeout_s", 300))
        result = _profile(job)
    except BaseException as exc:  # noqa: BLE001 - report, the oracle decides
        result = {"error": one_line(exc), "traceback": traceback.format_exc()[-2000:]}
    send(conn, result=result)


def _profile(job: dict[str, Any]) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import FlopCounterMode

    from oracle import harness, profiler_head, timing
    from tasks.runtime import exec_task_code

    device = job["device"]
    module = exec_task_code(job["code"], job["task_id"])
    model = harness._reference_model(module, job.get("init_seed", 42), device)
    inputs = harness._seeded_inputs(module, job.get("seed", 11), device)
    calls = int(job.get("calls", 3))

    counts: dict[str, dict[str, float]] = defaultdict(lambda: {"calls": 0, "bytes": 0})

    def nbytes(values: Any) -> int:
        if isinstance(values, torch.Tensor):
            return values.numel() * values.element_size()
        if isinstance(values, (list, tuple)):
            return sum(nbytes(v) for v in values)
        if isinstance(values, dict):
            return sum(nbytes(v) for v in values.values())
        return 0

    class Bytes(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = "aten::" + func.__name__.split(".")[0] if func.namespace == "aten" else str(func)
            entry = counts[name]
            entry["calls"] += 1
            entry["bytes"] += nbytes(args) + nbytes(kwargs or {}) + nbytes(out)
            return out

    with torch.no_grad():
        model(*inputs)  # warm-up: lazy init, allocator, library handles
        timing.sync(device)
        with Bytes():
            model(*inputs)
        flops_mode = FlopCounterMode(display=False)
        with flops_mode:
            model(*inputs)
        flops = {f"aten::{str(op).split('.')[-1]}": int(n) for op, n in flops_mode.get_flop_counts().get("Global", {}).items()}
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
        with profile(activities=activities) as prof:
            if device == "cuda":
                profiler_head.lead_with_fillers()  # the session's first kernel records may be lost: not the calls'
            for _ in range(calls):
                model(*inputs)
            timing.sync(device)

    # Inclusive time per operator the dispatcher saw (a convolution's time is in its mkldnn/cudnn child);
    # the whole is every aten operator's self time, so wrappers such as aten::linear land in "other".
    times: dict[str, float] = defaultdict(float)
    total_ms = 0.0
    for event in prof.key_averages():
        if not event.key.startswith("aten::"):
            continue
        if device == "cuda":
            inclusive, own = getattr(event, "device_time_total", 0.0), getattr(event, "self_device_time_total", 0.0)
        else:
            inclusive, own = event.cpu_time_total, event.self_cpu_time_total
        times[event.key] += float(inclusive) / 1000.0 / calls
        total_ms += float(own) / 1000.0 / calls
    from oracle.judge import NON_COMPUTE_OPS

    ridge = float(job.get("ridge") or RIDGE.get(device, 10.0))
    names = [n for n in counts if n not in NON_COMPUTE_OPS]
    total_ms = max(total_ms, sum(times.get(n, 0.0) for n in names), 1e-9)
    ops = []
    for name in names:
        f, b = flops.get(name, 0), int(counts[name]["bytes"])
        intensity = f / b if b else 0.0
        ops.append({
            "op": name, "calls": int(counts[name]["calls"]), "time_ms": round(times.get(name, 0.0), 6),
            "share": round(times.get(name, 0.0) / total_ms, 4), "flops": f, "bytes": b, "intensity": round(intensity, 3),
            "bound": "compute" if intensity >= ridge else "memory", "library": name in LIBRARY_OPS,
        })
    ops.sort(key=lambda o: (-o["time_ms"], o["op"]))
    counted = sum(o["time_ms"] for o in ops)
    return {"task": job["task_id"], "device": device, "ridge": ridge, "total_ms": round(total_ms, 6),
            "other_ms": round(max(0.0, total_ms - counted), 6), "ops": ops}


def profile_task(task: Any, device: str = "cpu", threads: int | None = None, init_seed: int = 42,
                 timeout_s: float = 300.0) -> dict[str, Any]:
    """Trusted side: profile a task's reference in a fresh worker; `{"error": ...}` when that fails."""
    from oracle import sandbox

    job = {"device": device, "task_id": task.id, "code": task.code, "init_seed": init_seed, "seed": 11,
           "calls": 3, "timeout_s": timeout_s, "threads": threads, "ridge": RIDGE.get(device, 10.0)}
    outcome = sandbox.run_to_result(sandbox.Worker(profile_entry, job))
    if outcome.timed_out_phase:
        return {"task": task.id, "device": device, "error": f"profiling took longer than {timeout_s:.0f} s"}
    if outcome.result is None:
        tail = outcome.stderr_tail.strip().splitlines()
        return {"task": task.id, "device": device,
                "error": f"the profiling worker {outcome.crashed}: {tail[-1] if tail else ''}".strip()}
    return {"task": task.id, "device": device, **outcome.result}
