"""The `Candidate` record: one model-written module that defines `ModelNew`, ready for the oracle.

The content hash names the candidate everywhere (build folder, run store, de-duplication), so it ignores
what a model changes between samples without changing the program: trailing whitespace, line endings and
blank lines around the module.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

BACKENDS = ("cuda", "cpp", "triton", "torch")

HASH_CHARS = 16


def normalise_source(source: str) -> str:
    """The form that is hashed: `\\n` line ends, no trailing spaces, no blank lines around the module."""
    lines = source.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    lines = [line.rstrip() for line in lines]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def content_hash(source: str) -> str:
    """sha256 of the normalised source, first 16 hex chars: equal programs share one build and one verdict."""
    data = normalise_source(source).encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest()[:HASH_CHARS]


@dataclass(frozen=True)
class Candidate:
    """A module source that defines `ModelNew` for one task, with the backend it is built with."""

    task_id: str
    backend: str  # one of BACKENDS
    source: str  # the Python module source that defines ModelNew
    hash: str  # content_hash(source)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}; expected one of {', '.join(BACKENDS)}")

    @classmethod
    def make(cls, task_id: str, source: str, backend: str) -> "Candidate":
        """Build the record with its hash computed here, so a hash never disagrees with its source."""
        return cls(task_id=task_id, backend=backend, source=source, hash=content_hash(source))
