"""Build cache for candidate extensions (oracle spec rules 5-7).

A candidate compiles its kernels by calling `torch.utils.cpp_extension.load_inline` when its module is
imported. Inside a worker, `install_build_hooks` wraps that call so that
- each extension builds into `<cache>/ext/<key>/`, where the key hashes the extension's own sources and
  functions, the flags, the compiler, the torch version and the GPU architecture: the same extension is
  never built twice, across runs too, even when the Python around it differs (samples of one task often
  share their kernel and differ in the glue);
- the extension's name is made unique per key (two candidates both naming theirs "relu" never collide,
  in the build folder or in the process's module table);
- only the present GPU's architecture is targeted, and the time spent compiling is recorded;
- the functions of the built module count their calls, which is how the oracle knows the candidate ran
  code of its own (rule 11).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_CACHE = Path(os.environ.get("KERNELSEARCH_CACHE", Path.home() / ".cache" / "kernelsearch"))
BUILD_FLAGS = {"cflags": ["-O3"], "cuda_cflags": ["-O3"]}


def cache_root(base: Path | None = None) -> Path:
    root = (base or DEFAULT_CACHE) / "builds"
    root.mkdir(parents=True, exist_ok=True)
    return root


@functools.lru_cache(maxsize=None)
def compiler_versions() -> str:
    """First line of each compiler's version, part of the cache key."""
    lines = []
    for tool in ("c++", "nvcc"):
        path = shutil.which(tool)
        if not path:
            continue
        try:
            out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        lines.append(f"{tool}: {(out.strip().splitlines() or [''])[-1 if tool == 'nvcc' else 0]}")
    return "\n".join(lines)


def _environment_parts(gpu_arch: str | None) -> list[str]:
    import torch

    return [json.dumps(BUILD_FLAGS, sort_keys=True), compiler_versions(), torch.__version__, gpu_arch or "cpu",
            platform.machine(), f"py{sys.version_info.major}.{sys.version_info.minor}"]


def _digest(parts: list[str]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode(errors="replace"))
        h.update(b"\0")
    return h.hexdigest()[:20]


def build_key(source: str, backend: str, gpu_arch: str | None) -> str:
    """The cache key of a whole candidate (its build outcome is recorded under it)."""
    return _digest([source, backend, *_environment_parts(gpu_arch)])


def extension_key(call_args: dict[str, Any], gpu_arch: str | None) -> str:
    """The cache key of one extension: the load_inline arguments that change the binary, and the toolchain."""
    relevant = {k: v for k, v in call_args.items() if k not in ("name", "verbose", "build_directory")}
    return _digest([json.dumps(relevant, sort_keys=True, default=str), *_environment_parts(gpu_arch)])


@dataclass
class BuildRecord:
    """What the hooks saw while the candidate's module was imported."""

    extensions: list[str] = field(default_factory=list)
    build_s: float = 0.0
    compiled: bool = False  # something was actually compiled (not found in the cache)
    error: str | None = None  # the compiler's first errors, trimmed
    calls: dict[str, int] = field(default_factory=dict)  # extension function -> calls made


class BuildFailed(Exception):
    """load_inline failed to compile; the message holds the compiler's first errors."""


def trim_compiler_output(text: str, max_lines: int = 12) -> str:
    """The first error lines of a compiler log: what a model needs to fix its code."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    errors = [i for i, ln in enumerate(lines) if "error" in ln.lower()]
    start = errors[0] if errors else max(0, len(lines) - max_lines)
    picked = lines[max(0, start - 1) : start - 1 + max_lines] if errors else lines[start:]
    return "\n".join(ln[:300] for ln in picked)


class _CountingModule:
    """Wraps a built extension module: calls pass through and are counted."""

    def __init__(self, module: Any, record: BuildRecord, ext_name: str) -> None:
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "_record", record)
        object.__setattr__(self, "_ext", ext_name)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._module, name)
        if not callable(value) or name.startswith("__"):
            return value
        key = f"{self._ext}.{name}"

        def counted(*args: Any, **kwargs: Any) -> Any:
            self._record.calls[key] = self._record.calls.get(key, 0) + 1
            return value(*args, **kwargs)

        return counted


def install_build_hooks(cache: Path, gpu_arch: str | None, record: BuildRecord) -> None:
    """Patch `load_inline`/`load` in this (worker) process to build into the keyed cache folders."""
    import inspect

    import torch.utils.cpp_extension as cpp

    if gpu_arch:
        os.environ["TORCH_CUDA_ARCH_LIST"] = gpu_arch  # only the present GPU: a build for all is several times slower
    os.environ.setdefault("MAX_JOBS", str(max(1, (os.cpu_count() or 2))))
    original_inline, original_load = cpp.load_inline, cpp.load

    def build(original, *args: Any, **kwargs: Any) -> Any:
        bound = inspect.signature(original).bind(*args, **kwargs)
        call = dict(bound.arguments)
        for k in ("extra_cflags", "extra_cuda_cflags"):
            if call.get(k) is None:
                call[k] = list(BUILD_FLAGS["cflags" if k == "extra_cflags" else "cuda_cflags"])
        if original is original_load:  # sources are files: key their contents
            call["_contents"] = [Path(p).read_text(errors="replace") for p in _as_list(call.get("sources"))]
        key = extension_key(call, gpu_arch)
        call.pop("_contents", None)
        unique = f"{_safe_name(str(call.get('name', 'ext')))}_{key[:12]}"
        build_dir = cache / "ext" / key
        build_dir.mkdir(parents=True, exist_ok=True)
        call.update(name=unique, build_directory=str(build_dir), verbose=False)
        before = _newest_library(build_dir)
        t0 = time.perf_counter()
        try:
            module = original(**call)
        except Exception as exc:  # noqa: BLE001 - the compiler's message is the useful part
            record.error = trim_compiler_output(str(exc))
            raise BuildFailed(record.error) from None
        after = _newest_library(build_dir)
        if after != before:
            record.compiled = True
            record.build_s += time.perf_counter() - t0
        record.extensions.append(unique)
        if call.get("is_python_module", True) is False:
            return module
        return _CountingModule(module, record, unique)

    def load_inline(*args: Any, **kwargs: Any) -> Any:
        return build(original_inline, *args, **kwargs)

    def load(*args: Any, **kwargs: Any) -> Any:
        return build(original_load, *args, **kwargs)

    cpp.load_inline = load_inline
    cpp.load = load


def _newest_library(folder: Path) -> float | None:
    times = [p.stat().st_mtime for p in folder.glob("*.so")]
    return max(times) if times else None


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def _safe_name(name: str) -> str:
    cleaned = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return cleaned if cleaned and not cleaned[0].isdigit() else f"ext_{cleaned}"
