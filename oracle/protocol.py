"""Messages between the oracle and its processes: typed records, sent as JSON over a pipe, never pickle.

A worker runs untrusted code, so the trusted side reads only bytes it parses as JSON (unpickling what a
candidate could write would let it run code in the oracle) and turns them into the records below with
`from_json`, which keeps the known fields only. Output tensors do not travel here: a worker describes where
they are (`oracle.shared_tensors.SharedTensor`) and the trusted reference process reads them from there.

The envelope of a message is one of: `phase` (the worker names what it does now, with a deadline), `clock`
(a mark the trusted side times by its own clock), `outputs` (`OutputsReady`), `checked` (`Checked`),
`result` (the worker's last word: `WorkerResult` or `BuildResult`), and, from the trusted side, `cmd`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, TypeVar

MAX_MESSAGE = 16 * 1024 * 1024

T = TypeVar("T", bound="Record")


def send(conn: Connection, **message: Any) -> None:
    conn.send_bytes(json.dumps({k: v.to_json() if isinstance(v, Record) else v for k, v in message.items()},
                               default=str).encode())


def receive(conn: Connection) -> dict[str, Any]:
    """One message; raises ValueError on anything that is not a JSON object of sane size."""
    data = conn.recv_bytes(MAX_MESSAGE)
    message = json.loads(data.decode())
    if not isinstance(message, dict):
        raise ValueError("worker sent a message that is not a JSON object")
    return message


class Record:
    """A dataclass that crosses a process boundary as a JSON object."""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_json(cls: type[T], data: Any) -> T:
        """The record from a JSON object; unknown keys are dropped, a missing required one is a ValueError."""
        if not isinstance(data, dict):
            raise ValueError(f"expected an object for {cls.__name__}")
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        try:
            return cls(**{k: v for k, v in data.items() if k in names})
        except TypeError as exc:
            raise ValueError(f"malformed {cls.__name__}: {exc}") from None


@dataclass
class Case(Record):
    """One correctness check: which task code (0: the task's size, 1: the smaller one) and which seed."""

    code: int
    seed: int


@dataclass
class BuildJob(Record):
    cache: str
    gpu_arch: str | None
    candidate_path: str
    pch: str | None
    backend: str
    build_timeout_s: float
    max_file_bytes: int


@dataclass
class BuildResult(Record):
    extensions: list[str]
    build_s: float
    compiled: bool
    error_kind: str | None  # None, "compile" or "import"
    message: str = ""
    pch_used: bool = False
    pch_wanted: list[dict[str, Any]] = field(default_factory=list)
    cuda_header: str | None = None
    binding_header: str | None = None


@dataclass
class CandidateJob(Record):
    device: str
    task_id: str
    codes: list[str]
    init_seed: int
    cases: list[dict[str, int]]  # Case.to_json() each
    timing_seeds: list[int]
    timing: dict[str, Any]  # TimingParams fields
    cache: str
    gpu_arch: str | None
    candidate_path: str
    pch: str | None
    backend: str
    import_timeout_s: float
    call_timeout_s: float
    time_timeout_s: float
    gpu_work_timeout_s: float  # a call's device work once its forward returned (CUDA)
    threads: int
    max_file_bytes: int
    share_dir: str | None  # CPU: where outputs are written for the trusted side (a memory-backed folder)


@dataclass
class OutputsReady(Record):
    """The worker's outputs of one call are ready to be read (the worker waits for `cmd: go`).
    kind: `check` (check `index`), `after` (check 0's outputs again, after check 1 ran), `timed` or `block`
    (one sampled output of timing input set `index`, from the event-timed calls or the clocked block)."""

    kind: str
    index: int
    tensors: list[dict[str, Any] | None]  # SharedTensor.to_json(), None for an output that is not a tensor


@dataclass
class Checked(Record):
    """What the worker saw while checking: for the own-kernel rule and the launch-bound flag."""

    own_calls: int
    ops: list[str]
    kernels: list[str]
    extensions: list[str]
    compiled_now: bool
    kernel_ms: float | None = None  # GPU time of the kernels of one profiled call (None on a CPU)
    flags: list[str] = field(default_factory=list)
    # what each CUDA profiling session recorded: [kernels, fillers recorded, fillers launched]
    profile_sessions: list[list[int]] = field(default_factory=list)
    # every session recorded nothing, not even its own filler kernels: the profiler could not say what ran
    kernels_unseen: bool = False


@dataclass
class WorkerResult(Record):
    """A candidate worker's last message: `timed` with its timing, or a failure it found itself."""

    status: str
    message: str = ""
    timing: dict[str, Any] | None = None


# ---------------------------------------------------------------- the trusted reference process


@dataclass
class PrepareTask(Record):
    """Compute and keep a task's reference outputs (every check and timing input set) on the device."""

    key: str
    task_id: str
    codes: list[str]
    cases: list[dict[str, int]]
    timing_seeds: list[int]
    init_seed: int
    call_timeout_s: float
    float64_max_bytes: int = 256 * 1024**2  # larger outputs get no float64 reference (the memory it keeps)
    expected_bytes: int = 0  # what it will keep, as the client guesses it: idle tasks make room first


@dataclass
class Prepared(Record):
    ops: list[str]
    kernels: list[str]
    floor: dict[str, Any] | None
    constant: bool  # every check's reference output is one repeated value
    output_bytes: int  # of one call's outputs at the task's size
    input_bytes: int  # of one call's inputs at the task's size
    reference_s: float  # seconds spent computing it (0 when it was kept from before)
    error: str | None = None
    float64: str | None = None  # why the float64 reference could not be made (None: it was, or not needed)
    kept_bytes: int = 0  # device memory the kept outputs (and float64 corrections) take
    # measured on a GPU (0 elsewhere): the model's parameters and buffers, and what one call at the task's
    # size allocates beyond them (its inputs, intermediates and outputs) at its peak
    param_bytes: int = 0
    working_bytes: int = 0


@dataclass
class TimeEager(Record):
    key: str
    timing: dict[str, Any]
    deadline_s: float


@dataclass
class Compare(Record):
    """Compare outputs a worker shared with the task's reference (`OutputsReady` fields, and the session),
    under every tolerance policy; `policy` is the one whose message is wanted."""

    session: int
    kind: str
    index: int
    tensors: list[dict[str, Any] | None]
    share_dir: str | None
    policy: str = "kernelbench"


@dataclass
class ErrorFigures(Record):
    """How far a candidate's outputs are from the reference, over the comparisons made (the worst of each):
    what `kernelsearch report --tolerance` needs to judge it under another policy (oracle.tolerance)."""

    max_abs: float = 0.0  # largest |out - ref| (the task's own-dtype reference), finite elements
    max_rel: float = 0.0  # largest |out - ref| / |ref| over the elements where ref is not 0
    rel_l2_64: float | None = None  # ||out - ref64|| / ||ref64||: against the float64 reference
    ref32_rel_l2_64: float | None = None  # the float32 reference's own ||ref32 - ref64|| / ||ref64|| (its scale)
    over_bound: dict[str, float] = field(default_factory=dict)  # policy -> worst error over its bound (<= 1 passes)
    float64: str | None = None  # why there was no float64 reference (None: there was, or no float output)

    def merged(self, other: "ErrorFigures | None") -> "ErrorFigures":
        if other is None:
            return self

        def worst(a: float | None, b: float | None) -> float | None:
            return b if a is None else a if b is None else max(a, b)

        bounds = dict(self.over_bound)
        for name, value in other.over_bound.items():
            bounds[name] = max(bounds.get(name, 0.0), value)
        return ErrorFigures(max(self.max_abs, other.max_abs), max(self.max_rel, other.max_rel),
                            worst(self.rel_l2_64, other.rel_l2_64), worst(self.ref32_rel_l2_64, other.ref32_rel_l2_64),
                            bounds, self.float64 or other.float64)


@dataclass
class Compared(Record):
    ok: bool  # under the asked policy
    message: str = ""
    max_abs_diff: float = 0.0
    seconds: float = 0.0
    passes: list[str] = field(default_factory=list)  # the policies these outputs pass
    errors: dict[str, Any] | None = None  # ErrorFigures.to_json()


@dataclass
class MemoryPeak(Record):
    """The most device memory one kind of request took in the reference process (a GPU only), in MiB:
    reserved by the caching allocator, and allocated to tensors. Reserved past the process's share is what
    can run the device out of memory beside the candidates' workers; reserved far past allocated is memory
    the allocator kept, not tensors."""

    reserved_mb: float = 0.0
    allocated_mb: float = 0.0

    def merged(self, other: "MemoryPeak") -> "MemoryPeak":
        return MemoryPeak(max(self.reserved_mb, other.reserved_mb), max(self.allocated_mb, other.allocated_mb))
