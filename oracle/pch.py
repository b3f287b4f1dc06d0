"""Precompiled headers for the C++ half of candidate builds: `torch/extension.h`, and the lite binding header.

Every `load_inline` build compiles a `main.cpp` that starts with `#include <torch/extension.h>`: the whole
PyTorch C++ API and pybind11, parsed from scratch each time. On a 2-core machine that parse is about 20 of
the 30-35 s a trivial C++ extension takes. gcc can load a precompiled header instead when (1) a
`torch/extension.h.gch` is found in an include folder searched before PyTorch's own, (2) it was made with
the same compiler and the same code-affecting flags, and (3) the include is the first thing in the file.
`load_inline` guarantees (3); this module makes the header once per flag set, keyed like the build cache,
and hands builds the `-I` folder that provides (1) and (2).

The header is made by the trusted side, never inside a candidate's worker (a worker's process group is
killed when the candidate is done, which would kill a half-made header with it). A build whose flag set
has no header yet compiles the ordinary way and asks for one; later builds use it. gcc checks a header's
validity itself and silently parses the real header when the flags differ, so a stale or mismatched
header can cost time but never change a binary.

A binding compiled against `oracle.build.LITE_BINDING_HEADER` (no torch/extension.h) is precompiled the
same way: the header's text is written to `kernelsearch/lite_binding.h` in the header's folder, beside its
`.gch`, and the binding includes it by that name (on the 2-core CPU machine, g++ -O3 on a CUDA kernel's
binding: 10 s against the text, 5.4 s against its precompiled header).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import inspect
import json
import os
import shlex
import shutil
import subprocess
import tempfile
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oracle.paths import DEFAULT_CACHE

HEADER = "torch/extension.h"
LITE_BINDING = "kernelsearch/lite_binding.h"  # oracle.build.LITE_BINDING_HEADER, written out to be precompiled
HEADERS = (HEADER, LITE_BINDING)


@dataclass(frozen=True)
class PchSpec:
    """How a build's C++ files are compiled: the compiler and the flags that must match the header's, and
    which header (`HEADERS`)."""

    cxx: str
    cflags: tuple[str, ...]
    torch: str  # the version whose headers it holds: an upgrade in place keeps their path, not their text
    header: str = HEADER

    @property
    def key(self) -> str:
        parts = [self.cxx, self.cflags, self.torch, _compiler_version(self.cxx)]
        if self.header != HEADER:  # torch/extension.h's keys stay those of the folders made before
            from oracle.build import LITE_BINDING_HEADER

            parts += [self.header, LITE_BINDING_HEADER]  # its text is ours: another text, another header
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]

    def to_json(self) -> dict[str, Any]:
        return {"cxx": self.cxx, "cflags": list(self.cflags), "torch": self.torch, "header": self.header}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "PchSpec":
        header = str(data.get("header") or HEADER)
        if header not in HEADERS:
            raise ValueError(f"no such header to precompile: {header}")
        return cls(str(data["cxx"]), tuple(str(f) for f in data["cflags"]), str(data["torch"]), header)


def default_root() -> Path:
    """`$KERNELSEARCH_PCH`, else `pch/` in the cache folder. Headers depend only on the toolchain, so
    caches of separate runs may share one folder of them (each header is several hundred MB)."""
    return Path(os.environ["KERNELSEARCH_PCH"]) if os.environ.get("KERNELSEARCH_PCH") else DEFAULT_CACHE / "pch"


def header_folder(root: Path, spec: PchSpec) -> Path:
    """The folder to put first on the include path: it holds the spec's header and its `.gch`."""
    return root / spec.key


def is_ready(root: Path, spec: PchSpec) -> bool:
    return (header_folder(root, spec) / "ready.json").exists()


@functools.lru_cache(maxsize=None)
def _version_text(cxx: str) -> str:
    try:
        return subprocess.run([*shlex.split(cxx), "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _compiler_version(cxx: str) -> str:
    return (_version_text(cxx).strip().splitlines() or [""])[0]


def _is_gcc(cxx: str) -> bool:
    text = _version_text(cxx)
    return "Free Software Foundation" in text and "clang" not in text


def spec_for(extra_cflags: list[str] | None, extra_include_paths: list[str] | None, with_cuda: bool,
             header: str = HEADER) -> PchSpec | None:
    """The compiler and C++ flags `load_inline` would use for these arguments, read from the ninja file that
    PyTorch writes for them (so a PyTorch release that changes its flags changes the key, not the result).
    None when this PyTorch cannot say, or the compiler is not gcc (clang's headers work differently)."""
    import torch.utils.cpp_extension as cpp

    writer = getattr(cpp, "_write_ninja_file_to_build_library", None)
    if writer is None:
        return None
    args = {"name": "kernelsearch_pch_probe", "extra_cflags": list(extra_cflags or []), "extra_cuda_cflags": [],
            "extra_sycl_cflags": [], "extra_ldflags": [], "extra_include_paths": list(extra_include_paths or []),
            "with_cuda": with_cuda, "with_sycl": False, "is_standalone": False}
    with tempfile.TemporaryDirectory(prefix="ks-pch-probe-") as tmp:
        source = Path(tmp) / "main.cpp"
        source.write_text("")
        params = inspect.signature(writer).parameters
        try:
            writer(path=str(Path(tmp) / "build.ninja"), sources=[str(source)],
                   **{k: v for k, v in args.items() if k in params})
            ninja = (Path(tmp) / "build.ninja").read_text()
        except Exception:  # noqa: BLE001 - a private PyTorch helper; without it there is no header, only slower builds
            return None
    variables = _ninja_variables(ninja)
    cxx, cflags = variables.get("cxx"), variables.get("cflags")
    if not cxx or cflags is None:
        return None
    if not _is_gcc(cxx):
        return None
    flags = tuple(f for f in shlex.split(cflags) if not f.startswith("-DTORCH_EXTENSION_NAME="))
    import torch

    return PchSpec(cxx, flags, torch.__version__, header)


def _ninja_variables(text: str) -> dict[str, str]:
    """Top-level `name = value` lines of a ninja file, with ninja's `$` escapes undone."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if line and not line[0].isspace() and " = " in line:
            name, value = line.split(" = ", 1)
            out[name.strip()] = value.replace("$ ", " ").replace("$:", ":").replace("$$", "$")
    return out


def make_header(root: Path, spec: PchSpec, wait: bool = True, timeout_s: float = 900.0) -> float | None:
    """Compile the precompiled header for `spec`, once: a lock keeps other makers out (with `wait=False`
    this returns None at once when another maker holds it). Returns the seconds spent, 0.0 when the header
    already existed, None when it was not made."""
    import torch.utils.cpp_extension as cpp

    if is_ready(root, spec):
        return 0.0
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{spec.key}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            return None
        if is_ready(root, spec):
            return 0.0
        for stale in root.glob(f"{spec.key}.tmp*"):  # left by a maker that was killed
            shutil.rmtree(stale, ignore_errors=True)
        work = Path(tempfile.mkdtemp(prefix=f"{spec.key}.tmp", dir=root))
        try:
            (work / spec.header).parent.mkdir(parents=True)
            # gcc wants the header beside its .gch, so that a fallback parse reads the same text: the real
            # torch/extension.h (compiled where it lies), or the lite binding header's text
            if spec.header == HEADER:
                header = Path(cpp.include_paths()[0]) / HEADER
                os.symlink(header, work / HEADER)
            else:
                from oracle.build import LITE_BINDING_HEADER

                header = work / spec.header
                header.write_text(LITE_BINDING_HEADER + "\n")
            started = time.perf_counter()
            cmd = [*shlex.split(spec.cxx), "-x", "c++-header", str(header), "-o", str(work / f"{spec.header}.gch"), *spec.cflags]
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
            if result.returncode != 0:
                (root / f"{spec.key}.failed.txt").write_text(shlex.join(cmd) + "\n" + result.stderr[-4000:])
                return None
            seconds = time.perf_counter() - started
            (work / "ready.json").write_text(json.dumps({**spec.to_json(), "seconds": round(seconds, 1)}))
            shutil.rmtree(header_folder(root, spec), ignore_errors=True)
            os.rename(work, header_folder(root, spec))
            return seconds
        except (OSError, subprocess.SubprocessError):
            return None
        finally:
            shutil.rmtree(work, ignore_errors=True)


_requested: set[tuple[str, str]] = set()


def request_header(root: Path, spec: PchSpec) -> subprocess.Popen | None:
    """Start making the header in a detached process (its own session and process group), unless it exists,
    failed before, is being made, or this process asked for it already; returns the process, if started.
    The process outlives a short-lived caller (`kernelsearch eval`) and finishes the header for the builds
    after it."""
    if (str(root), spec.key) in _requested or is_ready(root, spec) or (root / f"{spec.key}.failed.txt").exists():
        return None
    _requested.add((str(root), spec.key))
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{spec.key}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free: nobody is making it now
        except BlockingIOError:
            return None
    with open(root / f"{spec.key}.log", "w") as log:
        return subprocess.Popen([sys.executable, "-m", "oracle.pch", str(root), json.dumps(spec.to_json())],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                cwd=str(Path(__file__).resolve().parent.parent))


if __name__ == "__main__":
    made = make_header(Path(sys.argv[1]), PchSpec.from_json(json.loads(sys.argv[2])), wait=False)
    print("made" if made else "exists" if made == 0.0 else "not made (another maker holds it, or it failed)")
