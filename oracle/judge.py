"""Judging as pure functions: from outputs, a worker's report and a task's reference to a verdict.

Nothing here starts a process or touches a file, so every rule can be tested with plain tensors and
records. The oracle (`oracle.evaluate`) gathers the inputs: outputs the trusted reference process read from
a worker, the worker's `Checked` report and timing, and the task's `Reference`; the rules are in
docs/oracle.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

from oracle.compare import compare
from oracle.protocol import Checked, ErrorFigures
from oracle.timing import WALL_RATIO, drained_at_once, wall_disagrees
from oracle.tolerance import DEFAULT_POLICY, POLICIES, Float64Scale
from oracle.verdict import WORKER_STATUSES  # the only statuses a worker may report itself
from oracle.verdict import ratio_text

# Operators that move or shape data but compute nothing: calling them is not a fallback (docs/oracle.md,
# "Own kernel").
NON_COMPUTE_OPS = {
    f"aten::{n}" for n in (
        "empty empty_like empty_strided zeros zeros_like ones ones_like full full_like to _to_copy copy_ "
        "contiguous clone detach view reshape _reshape_alias _unsafe_view as_strided expand permute transpose t "
        "unsqueeze squeeze flatten select slice narrow split chunk unbind resize_ lift_fresh alias item "
        "_local_scalar_dense is_nonzero result_type new_empty new_zeros fill_ zero_ set_ stride size numel "
        "dropout feature_dropout lift lift_fresh_copy"
    ).split()
}
# A kernel whose GPU is busy for less than this share of its timed interval is mostly launch overhead.
LAUNCH_BOUND_BUSY = 0.5
PROFILE_MARGIN_MS = 0.005  # a profiled call's kernels may take this much past the events and still agree with them


@dataclass
class OutputsJudged:
    """One call's outputs against the reference: the asked policy's problem (None: they pass it), every
    policy they pass, and the error figures (None when no output was compared)."""

    problem: str | None
    passes: list[str]
    figures: ErrorFigures | None = None


def judge_outputs(outputs: list[torch.Tensor | None], expected: list[torch.Tensor | None], where: str,
                  policy: str = DEFAULT_POLICY, corrections: list[torch.Tensor | None] | None = None,
                  scales: list[Float64Scale | None] | None = None) -> OutputsJudged:
    """`outputs` against the `expected` ones under every tolerance policy; `where` names the call for the
    message. `corrections` and `scales` (per output) come from the float64 reference, where there is one."""
    if len(outputs) != len(expected):
        return OutputsJudged(f"{where}: forward returned {len(outputs)} output(s), expected {len(expected)}", [])
    passes, figures, problem = set(POLICIES), None, None
    for j, (out, ref) in enumerate(zip(outputs, expected)):
        label = f"output {j}" if len(expected) > 1 else "output"
        if ref is None:
            continue
        if out is None:
            return OutputsJudged(f"{where}: {label} is not a tensor", [], figures)
        correction = corrections[j] if corrections else None
        scale = scales[j] if scales else None
        result = compare(out, ref, label, policy, correction, scale)
        passes &= set(result.passes)
        figures = result.figures if figures is None else figures.merged(result.figures)
        if not result.ok and problem is None:
            problem = f"{where}: {result.message}"
        if not passes:
            break
    return OutputsJudged(problem, [p for p in POLICIES if p in passes], figures)


def check_name(index: int, checks: int, smaller: dict[str, Any] | None = None,
               sizes: dict[str, Any] | None = None) -> str:
    """How a message names a check. `smaller`: for the check at the second, smaller size, the size constants
    that differ there, and `sizes` their values at the task's size, so the message says which size failed."""
    name = f"check {index + 1} of {checks}"
    if smaller is None:
        return name
    if not smaller:
        return name + " (at the second, smaller size)"
    at = ", ".join(f"{k}={v}" for k, v in smaller.items())
    usual = ", ".join(f"{k}={(sizes or {}).get(k, '?')}" for k in smaller)
    return (f"{name} (at the second, smaller size {at}; the checks before it, at the task's size {usual}, "
            "passed: is the kernel specialised to one size?)")


def timed_name(kind: str, index: int) -> str:
    when = "a timed call" if kind == "timed" else "a call of the wall-clock block"
    return f"correct while checked but wrong in {when} (input set {index + 1})"


def unchanged(before: list[torch.Tensor | None], after: list[torch.Tensor | None]) -> bool:
    """A later call left an earlier call's outputs as they were (NaN equal to NaN); on the host where one of
    the two was copied there (a full device)."""

    def same(a: torch.Tensor, b: torch.Tensor) -> bool:
        if a.device != b.device:
            a, b = a.cpu(), b.cpu()
        return a.shape == b.shape and torch.equal(a.nan_to_num(0), b.nan_to_num(0))

    return all(a is None or b is None or same(a, b) for a, b in zip(before, after))


REUSED_OUTPUT = ("a later call changed the tensor returned by an earlier call (reused output buffer); "
                 "allocate a new output each call")


# A correct verdict whose own-kernel rule was skipped: every CUDA profiling session of its call recorded
# nothing, not even its own filler kernels, so it could not say which kernels ran (rule 14).
KERNELS_UNSEEN_FLAG = "kernels_unseen"


def own_kernel_problem(backend: str, source: str, checked: Checked, reference_ops: list[str]) -> str | None:
    """The candidate ran code of its own, and did not just call the operators it replaces."""
    if backend == "torch":
        return None  # only reachable with --allow-torch
    if checked.own_calls == 0:
        return "the custom kernel was never called: forward must call the compiled extension (or Triton kernel)"
    if backend == "cuda" and not checked.kernels_unseen:  # a blind profiler says nothing either way
        names = set(re.findall(r"__global__\s+(?:void\s+)?(?:__launch_bounds__\([^)]*\)\s+)?(?:void\s+)?(\w+)", source))
        if names and not any(n in k for k in checked.kernels for n in names):
            seen = ", ".join(k[:60] for k in sorted(checked.kernels)[:3]) + (", ..." if len(checked.kernels) > 3 else "")
            return ("none of the candidate's __global__ kernels ran on the GPU "
                    f"({', '.join(sorted(names))}); its extension only called PyTorch operators "
                    f"(the profiled call ran {len(checked.kernels)} kernels{': ' + seen if seen else ''}; "
                    f"its sessions recorded {_sessions_text(checked.profile_sessions)})")
    replaced = {op for op in reference_ops if op not in NON_COMPUTE_OPS}
    if replaced and replaced <= set(checked.ops):
        return ("the candidate still calls every PyTorch operator of the reference "
                f"({', '.join(sorted(replaced))}): replace them with the custom kernel, do not fall back to PyTorch")
    return None


def _sessions_text(sessions: list[list[int]]) -> str:
    return "; ".join(f"{k} kernels, {f} of {n} fillers" for k, f, n in sessions) or "nothing"


def worker_failure(result: Any) -> tuple[str, str]:
    """The (status, message) of a worker's early or failed result, never better than a failure."""
    if not isinstance(result, dict) or result.get("status") not in WORKER_STATUSES:
        status = result.get("status") if isinstance(result, dict) else None
        return "runtime_error", f"the candidate's process sent an unexpected result ({str(status)[:40]!r}): it must not write to the oracle's pipe"
    return result["status"], str(result.get("message", ""))[:2000]


def host_held(timing: dict[str, Any], kernel_ms: float | None) -> bool:
    """Whether a wall clock above the events is the host's alone: both blocks' GPUs had caught up when their
    last call was issued (`oracle.timing.drained_at_once`), and the profiled call's kernels, on every stream,
    took no longer than the events say. A launch-bound kernel on a host busy with builds is slow to issue,
    not slow; work on another stream that the events miss shows in one or the other (on a fast host as a
    GPU still busy at the end of the block, on a slow one in the profile)."""
    median = timing["median_ms"]
    drains = (timing.get("wall_drain_ms"), timing.get("external_drain_ms"))
    return (kernel_ms is not None and kernel_ms <= WALL_RATIO * median + PROFILE_MARGIN_MS
            and all(drained_at_once(d, median) for d in drains))


def score(timing: dict[str, Any], eager: dict[str, Any] | None, floor: dict[str, Any] | None,
          flags: list[str], kernel_ms: float | None = None) -> dict[str, Any]:
    """The verdict fields of a candidate that passed every check, from its timing and the task's baselines:
    status `correct` with its speed, or `rejected` when it is faster than physics allows."""
    flags = list(flags)
    time_ms = timing["median_ms"]
    eager = eager or {}
    # Events that miss work (side streams, threads) show as a wall clock far above them. The wall clock is
    # the larger of the worker's own and the one the trusted side measured around a block of calls (a
    # candidate can patch the clocks in its own process, not the oracle's).
    wall_ms = max(timing["wall_ms"], timing.get("external_ms") or 0.0)
    eager_wall = max(eager.get("wall_ms", 0), eager.get("external_ms") or 0.0)
    eager_ratio = eager_wall / eager["median_ms"] if eager.get("median_ms") else 1.0
    if wall_disagrees(wall_ms, time_ms, eager_ratio) and not host_held(timing, kernel_ms):
        flags.append("wall_clock_disagrees")
        time_ms = wall_ms
    # The events hold a call's GPU work alone (the host issues each batch behind a head start); the wall
    # clock, calls back to back, holds what issuing them costs too. Busy under half of that: launch-bound.
    per_call_ms = max(time_ms, wall_ms)
    busy = min(1.0, kernel_ms / per_call_ms) if kernel_ms is not None and per_call_ms > 0 else None
    if busy is not None and busy < LAUNCH_BOUND_BUSY:
        flags.append("launch_bound")  # the time is mostly launch overhead, not the kernels' work
    info: dict[str, Any] = {"candidate": timing, "eager": eager or None, "gpu_busy_fraction": busy}
    sol_ms = (floor or {}).get("sol_ms")
    if sol_ms and time_ms < sol_ms:  # nothing is faster than the floor (bytes over bandwidth, FLOPs over peak)
        return dict(status="rejected", flags=flags + ["below_floor"], time_ms=time_ms, sol_ms=sol_ms,
                    sol_fraction=sol_ms / time_ms if time_ms > 0 else None,
                    timing={"candidate": timing, "sol_ms": sol_ms, "floor": floor},
                    message=(f"impossible: faster than the memory/compute floor ({time_ms:.4g} ms < {sol_ms:.4g} ms "
                             f"for {floor['bytes'] / 1e6:.4g} MB and {floor['flops'] / 1e9:.4g} GFLOP); "
                             "the timing missed work or the work was skipped"))
    sol_fraction = sol_ms / time_ms if sol_ms and time_ms > 0 else None
    if sol_ms:
        info.update(sol_ms=sol_ms, sol_fraction=sol_fraction, floor=floor)
    eager_ms = eager.get("median_ms")
    sp_e = eager_ms / time_ms if eager_ms and time_ms > 0 else None
    return dict(status="correct", message=correct_message(time_ms, eager_ms, None), time_ms=time_ms, eager_ms=eager_ms,
                eager_measured_at=eager.get("measured_at"), speedup_vs_eager=sp_e, flags=flags, timing=info,
                sol_ms=sol_ms, sol_fraction=sol_fraction)


def with_compile_baseline(fields: dict[str, Any], compile_timing: dict[str, Any] | None,
                          compile_error: str | None) -> dict[str, Any]:
    """Add the `torch.compile` baseline to a correct verdict's fields (it is measured apart, off the
    device's critical path, and may arrive after the candidate was timed)."""
    fields = dict(fields)
    timing = dict(fields.get("timing") or {})
    timing["compile"] = compile_timing
    if compile_error:
        timing["compile_error"] = compile_error
    fields["timing"] = timing
    compile_ms = (compile_timing or {}).get("median_ms")
    time_ms = fields.get("time_ms")
    fields["compile_ms"] = compile_ms
    fields["speedup_vs_compile"] = compile_ms / time_ms if compile_ms and time_ms else None
    if fields.get("status") == "correct":
        fields["message"] = correct_message(time_ms, fields.get("eager_ms"), compile_ms)
    return fields


def correct_message(time_ms: float, eager_ms: float | None, compile_ms: float | None) -> str:
    speed = f"{time_ms:.4g} ms"
    if eager_ms and time_ms > 0:
        speed += f", {ratio_text(eager_ms / time_ms)}x eager PyTorch ({eager_ms:.4g} ms)"
    if compile_ms and time_ms > 0:
        speed += f", {ratio_text(compile_ms / time_ms)}x torch.compile ({compile_ms:.4g} ms)"
    return f"correct; {speed}"
