"""The verdict: what the oracle says about one candidate, in a form a search and a model can both use."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# `unsupported`: this oracle could not judge the candidate (a CUDA kernel on a CPU oracle, Triton not installed):
# the machine's limit, not the model's failure.
STATUSES = ("correct", "incorrect", "compile_error", "runtime_error", "timeout", "rejected", "no_code", "unsupported")


@dataclass
class Verdict:
    task: str
    status: str  # one of STATUSES
    message: str  # short, written to be fed back to the model for its next round
    backend: str | None = None
    hash: str | None = None
    device: str = "cpu"
    time_ms: float | None = None  # the candidate's median time per call
    eager_ms: float | None = None
    compile_ms: float | None = None
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    build_s: float | None = None  # compile time of the extension (0.0 when it came from the cache)
    build_cached: bool = False
    verify_s: float | None = None  # the worker's import and correctness checks
    time_s: float | None = None  # the worker's timing phase
    flags: list[str] = field(default_factory=list)  # e.g. "wall_clock_disagrees", "used_cache"
    timing: dict[str, Any] = field(default_factory=dict)  # spreads, call counts, the wall-clock cross-check
    sizes: dict[str, Any] = field(default_factory=dict)  # the task's fitted size constants
    sol_ms: float | None = None  # the physical floor: bytes over bandwidth, FLOPs over peak (rule 14)
    sol_fraction: float | None = None  # sol_ms / time_ms: how close to the floor (1.0 would be at it)
    # Device seconds this verdict cost, by phase: reference (the task's reference outputs, when this candidate
    # was the first of its task), baselines (eager timed), checks, timing.
    device_s: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown verdict status {self.status!r}")

    @property
    def correct(self) -> bool:
        return self.status == "correct"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Verdict":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})
