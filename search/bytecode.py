"""Bytecode for an install that has none: torch and Ray compiled once per cache, not once per process.

A run starts several Python processes that import torch and Ray: the command itself, the oracle and
generator actors, the workers' fork server, the reference process. Where torch was installed without
bytecode (`uv` and `pip --no-compile` installs, common in container images) and none is written beside it
(its folder is read-only, or `PYTHONDONTWRITEBYTECODE` is set, as container images often do), every one of
those processes compiles torch from source again: about 4.5 s of CPU each for torch and its dynamo, most
of it on the path to the first build (with bytecode, an H100 host's cores were all busy 10 s sooner in a
throughput run, and the demo on a 2-core CPU took 57 s instead of 72: benchmarks/RESULTS.md). Python
can keep bytecode in a folder of its own (`sys.pycache_prefix`, and `PYTHONPYCACHEPREFIX` for the
processes started after it); this turns that on, under the run's cache folder, for exactly that case.
Nothing is ever written beside the sources. An install with bytecode, or one whose folder Python writes
bytecode to anyway, is left as it is (with a prefix set Python reads no bytecode from beside the sources,
so turning it on there would cost a compile), as is a prefix the user chose.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

PREFIX_VARIABLE = "PYTHONPYCACHEPREFIX"
PROBE_PACKAGE = "torch"  # the largest import of every process a run starts


def lacks_bytecode(package: str = PROBE_PACKAGE) -> bool:
    """Whether `package` is installed from source with no bytecode beside it, and none will be written there."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return False
    cached = Path(importlib.util.cache_from_source(spec.origin))
    if cached.exists():
        return False
    folder = cached.parent if cached.parent.exists() else cached.parent.parent
    return sys.flags.dont_write_bytecode or not os.access(folder, os.W_OK)


def keep_bytecode(cache: Path, package: str = PROBE_PACKAGE) -> Path | None:
    """Keep bytecode under `cache/bytecode` for this process and the ones it starts, where `package` has
    none of its own (see the module's docstring); returns the folder, or None where nothing changed. Call it
    before `package` is imported."""
    if sys.pycache_prefix or os.environ.get(PREFIX_VARIABLE) or not lacks_bytecode(package):
        return None
    folder = cache / "bytecode"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    sys.pycache_prefix = str(folder)
    sys.dont_write_bytecode = False  # written only under the prefix, never beside the sources
    os.environ[PREFIX_VARIABLE] = str(folder)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    return folder
