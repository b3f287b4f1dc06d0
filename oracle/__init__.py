"""The oracle: build, verify and time candidate kernels in isolated workers, and give verdicts.

Its names are imported on first use: `oracle.paths` and the other light modules stay importable before
torch is (the command line sets up bytecode before it imports torch: `search.bytecode`).
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {"Candidate": "oracle.candidate", "BuildOutcome": "oracle.evaluate", "Oracle": "oracle.evaluate",
          "OracleConfig": "oracle.evaluate", "STATUSES": "oracle.verdict", "Verdict": "oracle.verdict"}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'oracle' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
