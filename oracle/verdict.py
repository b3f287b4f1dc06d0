"""The verdict: what the oracle says about one candidate, in a form a search and a model can both use.

This module also holds the project's one vocabulary of statuses: the oracle's verdicts, the search's
`cancelled`, which of them count as a judged sample, and how people see them (short names, colours).
Everything that names a status (the oracle's worker protocol, statistics, the report, the live view, the
CLI) imports it from here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from oracle.protocol import ErrorFigures

# What the oracle can say about a candidate. `unsupported`: this oracle could not judge it (a CUDA kernel on a
# CPU oracle, Triton not installed): the machine's limit, neither the model's success nor its failure.
STATUSES = ("correct", "incorrect", "compile_error", "runtime_error", "timeout", "rejected", "no_code", "unsupported")
UNSUPPORTED = "unsupported"
# A sample whose task stopped before it was judged: a status of sample records, never of a verdict.
CANCELLED = "cancelled"
SAMPLE_STATUSES = STATUSES + (CANCELLED,)
# Statuses that say nothing about the model: such samples are left out of n in pass@k and its kin.
NOT_JUDGED = frozenset({UNSUPPORTED, CANCELLED})
# The only verdicts a candidate's worker may report itself; anything else in its result is a fault.
WORKER_STATUSES = frozenset({"runtime_error", "rejected", "incorrect", "compile_error"})

# How tables and the live view name and colour each status (rich style names).
SHORT_NAMES = {"correct": "ok", "incorrect": "wrong", "compile_error": "compile", "runtime_error": "runtime",
               "timeout": "timeout", "rejected": "rejected", "unsupported": "unsupported", "no_code": "no code",
               "cancelled": "cancelled"}
STYLES = {"correct": "green", "incorrect": "red", "compile_error": "magenta", "runtime_error": "red",
          "timeout": "yellow", "rejected": "yellow", "unsupported": "cyan", "no_code": "dim", "cancelled": "dim"}


def ratio_text(ratio: float) -> str:
    """A speedup for people and prompts: two decimals, or two significant digits below 0.01, where two
    decimals would call a kernel 3000 times slower than eager "0.00x"."""
    return f"{ratio:.2f}" if abs(ratio) >= 0.01 else f"{ratio:.2g}"


def is_judged(status: str) -> bool:
    """Whether a sample with this status counts toward n: the oracle judged what the model wrote."""
    return status not in NOT_JUDGED


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
    # When that eager baseline was timed (time.time()): a search re-times a lone best kernel only when its
    # baseline is older than the run (read from the disk cache), `search.controller`
    eager_measured_at: float | None = None
    compile_ms: float | None = None
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    build_s: float | None = None  # compile time of the extension (0.0 when it came from the cache)
    build_cached: bool = False
    build_pch: bool = False  # its C++ half was compiled against a precompiled torch/extension.h (oracle.pch)
    build_header: str | None = None  # the header its CUDA sources compiled against: lite, types, as written
    build_binding_header: str | None = None  # what its main.cpp (the Python binding) compiled against: lite, full
    verify_s: float | None = None  # the worker's import and correctness checks
    time_s: float | None = None  # the worker's timing phase
    flags: list[str] = field(default_factory=list)  # e.g. "wall_clock_disagrees", "used_cache"
    timing: dict[str, Any] = field(default_factory=dict)  # spreads, call counts, the wall-clock cross-check
    sizes: dict[str, Any] = field(default_factory=dict)  # the task's fitted size constants
    sol_ms: float | None = None  # the physical floor: bytes over bandwidth, FLOPs over peak (docs/oracle.md, Timing)
    sol_fraction: float | None = None  # sol_ms / time_ms: how close to the floor (1.0 would be at it)
    # Device seconds this verdict cost, by phase: reference (the task's reference outputs, when this candidate
    # was the first of its task), baselines (eager timed), checks, timing.
    device_s: dict[str, float] = field(default_factory=dict)
    # Seconds it waited in the oracle, working on nothing: for a build slot (`build`), for a device slot once
    # built (`device`), for room beside other tasks' references (`reference_memory`, in its device slot), for
    # its task's reference while another thread made it (`reference`).
    queued_s: dict[str, float] = field(default_factory=dict)
    tolerance: str = "kernelbench"  # the tolerance policy the status follows (oracle.tolerance)
    # The policies under which the candidate passed every comparison made (docs/oracle.md, "Tolerance
    # policies"): with the status's policy among them only when `correct`; others where a policy failed but
    # these went on passing (checked to the end, not timed). Empty for any other failure.
    passes: list[str] = field(default_factory=list)
    errors: ErrorFigures | None = None  # the worst errors against the reference, over the comparisons made

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown verdict status {self.status!r}")

    @property
    def correct(self) -> bool:
        return self.status == "correct"

    @property
    def candidate_device_s(self) -> float:
        """Seconds the candidate itself held the oracle's device: its checks and its timing (`device_s` also
        counts what the trusted side did for it there)."""
        return (self.verify_s or 0.0) + (self.time_s or 0.0)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Verdict":
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        if isinstance(fields.get("errors"), dict):
            fields["errors"] = ErrorFigures.from_json(fields["errors"])
        return cls(**fields)
