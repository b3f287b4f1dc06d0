"""The run store: everything a run produced, in a folder a person (and `kernelsearch report`) can read back.

- `config.json`: everything needed to repeat the run (tasks with their fitted code and sizes, generator,
  strategy and options, n, rounds, seeds, versions, hardware).
- `samples.jsonl`: one `SampleRecord` a line, appended and flushed (fsync) as each sample completes. A crash
  can only tear the last line, which was never recorded: `read_samples` does not read it and
  `RunStore.open` cuts it, so a resumed run records no sample twice and loses none.
- `baselines.jsonl`: one `CompileBaseline` a line: a task's `torch.compile` time, recorded once it is
  measured. A correct sample is recorded as soon as it is judged, before its task's compile baseline
  (compiled in the background, it can take minutes), so a run cut short keeps every verdict it reached.
- `best/`: the best kernel of each task (`<task>.py`) and its verdict (`<task>.json`), re-timed or its own
  (`search.controller.timing_stands`).

`read_samples` is the one reader of `samples.jsonl` and of the `baselines.jsonl` beside it: it gives each
correct verdict that was recorded before its task's baseline its `torch.compile` speedup. It also reads
the flat records that runs wrote before `SampleRecord` (no `schema` field), so old run folders still report.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from oracle import judge
from oracle.candidate import BACKENDS, Candidate
from oracle.extract import extract_source
from oracle.protocol import MemoryPeak
from oracle.verdict import CANCELLED, SAMPLE_STATUSES, Verdict, is_judged
from strategies.base import Attempt

SCHEMA = 2  # samples.jsonl records with a nested verdict and candidate; 1 (no `schema` field): flat records
CANCELLED_MESSAGE = "the task had stopped before this sample was judged"
BASELINES = "baselines.jsonl"  # beside samples.jsonl


class StoreError(Exception):
    """The run folder cannot be used (exists when it should not, lacks config.json, a line is not a record)."""


def task_slug(task_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "__", task_id)


# ---------------------------------------------------------------- the record


@dataclass
class SampleRecord:
    """One sample of a run: which slot it filled, what the generator wrote and what it cost, the candidate
    taken from it and the oracle's whole verdict (timings, speed-of-light figures, flags, device).

    `status` is the verdict's, or `cancelled` for a sample whose task stopped before it was judged (it has
    no verdict). A duplicate (`duplicate_of`: the sample index that first brought the same candidate) carries
    the earlier verdict and cost the oracle nothing.
    """

    task: str
    strategy: str
    round: int  # 0-based
    # The chain the sample belongs to: where rounds build on each other (refine, agents) the chain they
    # continue (0..n-1), else the sample's own index (it starts afresh: a chain of its own). None in flat
    # records written before samples named their chain.
    chain: int | None
    sample_index: int  # round * n + position in the round: the task's sample order and its slot, from 0
    seed: int
    status: str  # one of oracle.verdict.SAMPLE_STATUSES
    verdict: Verdict | None = None  # None only when cancelled
    candidate: Candidate | None = None  # None when the completion held no code (or the sample was cancelled first)
    duplicate_of: int | None = None
    completion: str = ""  # the generator's text ("" when generation failed)
    tokens_in: int = 0  # prompt tokens
    tokens_out: int = 0  # generated tokens
    generation_s: float | None = None  # from the request's start to this sample's last token
    finish_reason: str | None = None
    replica: int | None = None  # which generator replica wrote it
    node: str | None = None  # the Ray node of the oracle that judged it (where the pool knows it)
    oracle_device_s: float = 0.0  # seconds this sample held the oracle's device (0 for duplicates)
    messages: list[dict[str, str]] = field(default_factory=list)  # the prompt
    agent_steps: list[dict[str, Any]] = field(default_factory=list)  # a strategy's helper completions
    recorded_at: float = 0.0  # time.time()

    def __post_init__(self) -> None:
        if self.status not in SAMPLE_STATUSES:
            raise ValueError(f"unknown sample status {self.status!r}")
        if (self.verdict is None) != (self.status == CANCELLED):
            raise ValueError("a sample has a verdict unless it was cancelled")
        if self.verdict is not None and self.verdict.status != self.status:
            raise ValueError(f"status {self.status!r} differs from its verdict's {self.verdict.status!r}")

    # ------------------------------------------------------------ what readers ask

    @property
    def key(self) -> tuple[str, int]:
        """The slot a sample fills: (task, sample_index)."""
        return self.task, self.sample_index

    @property
    def message(self) -> str:
        return self.verdict.message if self.verdict is not None else CANCELLED_MESSAGE

    @property
    def judged(self) -> bool:
        """A sample that counts toward n (see `oracle.verdict.NOT_JUDGED`)."""
        return is_judged(self.status)

    @property
    def correct(self) -> bool:
        return self.status == "correct"

    @property
    def hash(self) -> str | None:
        if self.candidate is not None:
            return self.candidate.hash
        return self.verdict.hash if self.verdict is not None else None

    @property
    def backend(self) -> str | None:
        if self.candidate is not None:
            return self.candidate.backend
        return self.verdict.backend if self.verdict is not None else None

    @property
    def source(self) -> str | None:
        return self.candidate.source if self.candidate is not None else None

    @property
    def time_ms(self) -> float | None:
        return _finite(self.verdict.time_ms) if self.verdict is not None else None

    @property
    def speedup_vs_eager(self) -> float | None:
        return _finite(self.verdict.speedup_vs_eager) if self.verdict is not None else None

    @property
    def speedup_vs_compile(self) -> float | None:
        return _finite(self.verdict.speedup_vs_compile) if self.verdict is not None else None

    @property
    def compile_ms(self) -> float | None:
        return _finite(self.verdict.compile_ms) if self.verdict is not None else None

    @property
    def flags(self) -> list[str]:
        return list(self.verdict.flags) if self.verdict is not None else []

    @property
    def build_s(self) -> float | None:
        """Build seconds this sample cost (0 for a duplicate: it reused the earlier build)."""
        if self.duplicate_of is not None:
            return 0.0
        return _finite(self.verdict.build_s) if self.verdict is not None else None

    @property
    def verify_s(self) -> float | None:
        if self.duplicate_of is not None or self.verdict is None:
            return None
        return _finite(self.verdict.verify_s)

    def attempt(self) -> Attempt:
        """This sample as a strategy sees an earlier round of its chain."""
        return Attempt(self.round, self.completion, self.status, self.message, self.speedup_vs_eager, self.source)

    # ------------------------------------------------------------ the line format

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **asdict(self)}  # the verdict and the candidate nest as objects

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "SampleRecord":
        """A record from one line of samples.jsonl, of this schema or of the flat one before it. Raises
        ValueError, KeyError or TypeError when the line is not a record."""
        if not isinstance(data, dict):
            raise TypeError("not a JSON object")
        if data.get("schema") is None:
            return cls._from_flat(data)
        if data["schema"] != SCHEMA:
            raise ValueError(f"schema {data['schema']!r} is not one this version reads ({SCHEMA})")
        values = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        values["verdict"] = Verdict.from_json(data["verdict"]) if data.get("verdict") is not None else None
        values["candidate"] = Candidate(**data["candidate"]) if data.get("candidate") is not None else None
        return cls(**values)

    @classmethod
    def _from_flat(cls, data: dict[str, Any]) -> "SampleRecord":
        """The flat records of runs made before this schema: the verdict's fields beside the sample's, no
        source (it is taken from the completion again, once, here), `sample_number` for the index and a
        `chain` only in the latest of them."""
        task, status = data["task"], data["status"]
        if not isinstance(task, str) or not isinstance(status, str):
            raise TypeError("task and status must be strings")
        index = _int(data.get("sample_number"))
        index = index if index is not None else _int(data.get("sample"))
        duplicate = _int(data.get("duplicate_of"))
        verdict = None
        if status != CANCELLED:  # a null field takes the verdict's default (a duplicate's `device_s`, say)
            present = {k: v for k, v in data.items() if v is not None}
            verdict = Verdict.from_json({**present, "task": task, "message": str(data.get("message") or "")})
        completion = data.get("completion") if isinstance(data.get("completion"), str) else ""
        candidate = None
        if isinstance(data.get("hash"), str) and data.get("backend") in BACKENDS:
            source, _ = extract_source(completion)
            if source is not None:
                candidate = Candidate(task_id=task, backend=data["backend"], source=source, hash=data["hash"])
        device_s = 0.0
        if verdict is not None and duplicate is None:
            device_s = (_finite(verdict.verify_s) or 0.0) + (_finite(verdict.time_s) or 0.0)
        return cls(
            task=task, strategy=str(data.get("strategy") or ""), round=_int(data.get("round")) or 0,
            chain=_int(data.get("chain")), sample_index=index or 0, seed=_int(data.get("seed")) or 0, status=status,
            verdict=verdict, candidate=candidate, duplicate_of=duplicate, completion=completion,
            tokens_in=_int(data.get("prompt_tokens")) or 0, tokens_out=_int(data.get("tokens")) or 0,
            generation_s=_finite(data.get("generation_s")), finish_reason=data.get("finish_reason"),
            replica=_int(data.get("replica")), node=data.get("node") if isinstance(data.get("node"), str) else None,
            oracle_device_s=device_s,
            messages=list(data.get("messages") or []), agent_steps=list(data.get("agent_steps") or []),
            recorded_at=_finite(data.get("recorded_at")) or 0.0)


@dataclass
class CompileBaseline:
    """A task's `torch.compile` baseline as the oracle measured it: the timing, or why there is none."""

    task: str
    compile: dict[str, Any] | None  # the timing (median_ms, spread, ...); None with `compile_error`
    compile_error: str | None = None
    recorded_at: float = 0.0  # time.time()

    @classmethod
    def of(cls, verdict: Verdict, recorded_at: float) -> "CompileBaseline | None":
        """The baseline a verdict carries (`judge.with_compile_baseline` added it); None if it has none."""
        if "compile" not in verdict.timing:
            return None
        return cls(verdict.task, verdict.timing["compile"], verdict.timing.get("compile_error"), recorded_at)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> "CompileBaseline":
        if not isinstance(data, dict) or not isinstance(data.get("task"), str):
            raise TypeError("not a baseline record (no task)")
        timing = data.get("compile")
        error = data.get("compile_error")
        if timing is not None and not isinstance(timing, dict) or error is not None and not isinstance(error, str):
            raise TypeError("compile must be a timing object and compile_error a string")
        return cls(data["task"], timing, error, _finite(data.get("recorded_at")) or 0.0)


@dataclass
class OracleDevice:
    """Where one oracle's device time went so far (`oracles_device` in config.json): how long it has been
    up, busy (anything on the device) and held alone, seconds by what held it alone (a candidate's timing,
    the eager and `torch.compile` baselines, a profile) and by the phases of the candidates' device slots;
    and when it was first asked to judge a candidate, against `oracles_started`'s `ready_at`: how long a
    ready oracle waited for its first work."""

    node: str | None
    alive_s: float
    busy_s: float
    exclusive_s: float
    exclusive_by: dict[str, float]
    exclusive_times: dict[str, int]
    phases_s: dict[str, float]
    reference_peak_mb: float = 0.0  # the most device memory its reference process reserved (a GPU only)
    # by kind of request (prepare, time_eager, compare...): the most reserved and allocated, in MiB
    reference_peaks: dict[str, MemoryPeak] = field(default_factory=dict)
    first_evaluate_at: float | None = None  # seconds since the epoch; None: no candidate asked for yet

    @classmethod
    def of(cls, stats: dict[str, Any]) -> "OracleDevice":
        """From an oracle actor's `stats()`."""
        by = stats.get("device_exclusive_by") or {}
        return cls(stats.get("node_label"), round(float(stats.get("alive_s", 0.0)), 2),
                   round(float(stats.get("device_busy_s", 0.0)), 2), round(float(stats.get("device_exclusive_s", 0.0)), 2),
                   {k: round(float(v[0]), 2) for k, v in by.items()}, {k: int(v[1]) for k, v in by.items()},
                   {k: round(float(v), 2) for k, v in (stats.get("device_phases_s") or {}).items()},
                   float(stats.get("reference_peak_mb") or 0.0), _peaks(stats.get("reference_peaks")),
                   _seconds(stats.get("first_evaluate_at")))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> "OracleDevice":
        if not isinstance(data, dict):
            raise TypeError("not an oracle's device record")
        numbers = lambda d: {str(k): float(v) for k, v in (d or {}).items()}  # noqa: E731
        return cls(data.get("node"), float(data.get("alive_s", 0.0)), float(data.get("busy_s", 0.0)),
                   float(data.get("exclusive_s", 0.0)), numbers(data.get("exclusive_by")),
                   {str(k): int(v) for k, v in (data.get("exclusive_times") or {}).items()},
                   numbers(data.get("phases_s")), float(data.get("reference_peak_mb") or 0.0),
                   _peaks(data.get("reference_peaks")), _seconds(data.get("first_evaluate_at")))


def _seconds(value: Any) -> float | None:
    return None if value is None else float(value)


def _peaks(data: Any) -> dict[str, MemoryPeak]:
    return {str(op): MemoryPeak.from_json(p) for op, p in (data or {}).items() if isinstance(p, dict)}


def with_baseline(record: SampleRecord, baseline: CompileBaseline | None) -> SampleRecord:
    """The record with its task's compile baseline, if it is a correct one recorded before it (else itself)."""
    verdict = record.verdict
    if baseline is None or verdict is None or verdict.status != "correct" or verdict.time_ms is None \
            or "compile" in verdict.timing:
        return record
    fields = judge.with_compile_baseline(verdict.to_json(), baseline.compile, baseline.compile_error)
    return replace(record, verdict=Verdict.from_json(fields))


def _finite(x: Any) -> float | None:
    """A finite number, or None (missing, null, a string, NaN): figures read from disk may be anything."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(x) else None


def _int(x: Any) -> int | None:
    return int(x) if isinstance(x, int) and not isinstance(x, bool) else None


# ---------------------------------------------------------------- reading JSON lines


@dataclass
class JsonLines:
    """A JSON-lines file as read: the parsed lines, the ones that are not JSON, and an unterminated last line."""

    rows: list[tuple[int, Any]]  # (line number from 1, value)
    bad: list[tuple[int, str]]  # (line number, why: "is not valid JSON (...)")
    tail: tuple[int, str] | None = None  # (line number, text) of a last line without its newline (being
    # written, or cut by a crash)


def read_jsonl(path: Path) -> JsonLines:
    """Every line of a JSON-lines file; blank lines are skipped. Raises OSError or UnicodeDecodeError."""
    lines = path.read_text(encoding="utf-8").split("\n")
    last = lines.pop()  # "" when the file ends with a newline
    out = JsonLines([], [], (len(lines) + 1, last) if last.strip() else None)
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.rows.append((number, json.loads(line)))
        except json.JSONDecodeError as exc:
            out.bad.append((number, f"is not valid JSON ({exc.msg})"))
    return out


def read_samples(path: Path) -> list[SampleRecord]:
    """The sample records of a samples.jsonl, in file order, with the compile baselines of the
    baselines.jsonl beside it added. An unterminated last line was never recorded and is not read; any
    other line that is not a record is a StoreError that names it (one line)."""
    records = []
    for number, data in _rows(path, "samples"):
        try:
            records.append(SampleRecord.from_json(data))
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreError(f"{path}: line {number} is not a sample record ({_why(exc)})") from None
    baselines = read_baselines(path.parent / BASELINES)
    return [with_baseline(r, baselines.get(r.task)) for r in records]


def read_baselines(path: Path) -> dict[str, CompileBaseline]:
    """The compile baseline of each task in a baselines.jsonl (none when the file is missing: a run made
    before the file, or one whose baselines all came with their verdicts). The first line of a task counts."""
    if not path.exists():
        return {}
    found: dict[str, CompileBaseline] = {}
    for number, data in _rows(path, "baselines"):
        try:
            baseline = CompileBaseline.from_json(data)
        except TypeError as exc:
            raise StoreError(f"{path}: line {number} is not a baseline record ({exc})") from None
        found.setdefault(baseline.task, baseline)
    return found


def _rows(path: Path, what: str) -> list[tuple[int, Any]]:
    """The parsed lines of one of the run's JSON-lines files, or a StoreError naming the file (and the
    first line that is not JSON)."""
    try:
        lines = read_jsonl(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise StoreError(f"{path}: cannot read the {what} ({exc.__class__.__name__})") from None
    if lines.bad:
        raise StoreError(f"{path}: line {lines.bad[0][0]} is not valid JSON")
    return lines.rows


def _why(exc: Exception) -> str:
    return f"no {exc.args[0]!r}" if isinstance(exc, KeyError) else str(exc).splitlines()[0][:200]


# ---------------------------------------------------------------- the folder


class RunStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.samples_path = root / "samples.jsonl"
        self.baselines_path = root / BASELINES
        self.best_dir = root / "best"
        self._lock = threading.Lock()

    @classmethod
    def create(cls, root: Path, config: dict[str, Any]) -> "RunStore":
        if (root / "samples.jsonl").exists() or (root / "config.json").exists():
            raise StoreError(f"{root} already holds a run: use --resume {root}, or another --out")
        root.mkdir(parents=True, exist_ok=True)
        store = cls(root)
        store.best_dir.mkdir(exist_ok=True)
        (root / "config.json").write_text(json.dumps(config, indent=1))
        store.samples_path.touch()
        return store

    @classmethod
    def open(cls, root: Path) -> "RunStore":
        if not (root / "config.json").is_file():
            raise StoreError(f"{root} is not a run folder (no config.json)")
        store = cls(root)
        store.best_dir.mkdir(exist_ok=True)
        store._drop_torn_tail(store.samples_path)
        if store.baselines_path.exists():
            store._drop_torn_tail(store.baselines_path)
        return store

    def config(self) -> dict[str, Any]:
        return json.loads((self.root / "config.json").read_text())

    def update_config(self, **fields: Any) -> None:
        config = self.config()
        config.update(fields)
        path = self.root / "config.json"
        tmp = path.with_suffix(".json.tmp")  # whole or not at all: it is rewritten while the run goes on
        tmp.write_text(json.dumps(config, indent=1))
        tmp.replace(path)

    @staticmethod
    def _drop_torn_tail(path: Path) -> None:
        """Cut a last line that a crash left without its newline (it never counted as recorded), so that
        the next append starts a line of its own."""
        if not path.exists():
            path.touch()
            return
        data = path.read_bytes()
        if data and not data.endswith(b"\n"):
            keep = data.rfind(b"\n") + 1
            with open(path, "r+b") as f:
                f.truncate(keep)

    def samples(self) -> list[SampleRecord]:
        return read_samples(self.samples_path) if self.samples_path.exists() else []

    def append(self, record: SampleRecord) -> None:
        self._append_line(self.samples_path, record.to_json())

    def append_baseline(self, baseline: CompileBaseline) -> None:
        self._append_line(self.baselines_path, baseline.to_json())

    def baselines(self) -> dict[str, CompileBaseline]:
        return read_baselines(self.baselines_path)

    def _append_line(self, path: Path, data: dict[str, Any]) -> None:
        line = json.dumps(data, default=str) + "\n"
        with self._lock, open(path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def write_best(self, task_id: str, source: str, verdict: dict[str, Any]) -> None:
        slug = task_slug(task_id)
        (self.best_dir / f"{slug}.py").write_text(source)
        (self.best_dir / f"{slug}.json").write_text(json.dumps(verdict, indent=1, default=str))

    def best(self, task_id: str) -> dict[str, Any] | None:
        path = self.best_dir / f"{task_slug(task_id)}.json"
        return json.loads(path.read_text()) if path.exists() else None
