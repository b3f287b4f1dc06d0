"""Build cache for candidate extensions (docs/oracle.md, "Build").

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
  code of its own (docs/oracle.md, "Own kernel");
- two cuts to a cold build's time, both invisible in the binary's behaviour: the C++ half (main.cpp, the
  Python binding) compiles against the lite header plus pybind11 and PyTorch's casters (`LITE_BINDING_HEADER`),
  or where that fails against `torch/extension.h`, precompiled when one exists for its flags (`oracle.pch`); CUDA sources that
  include `torch/extension.h` only for tensors compile against a lighter header (nvcc's three passes,
  cudafe++, cicc and the host compiler, each parse every header the source includes; that parse, not the
  kernel, is most of a CUDA build). Two rungs are tried in turn: `lite`, the tensor type and the handful of
  operators kernels' glue uses (`LITE_HEADER`), then `torch/types.h`; a source that still misses a
  declaration is built as written.
A folder is decided, built and recorded by one process at a time (`_folder_held`): two candidates sharing
an extension and built at once would otherwise leave its choices out of step with the flags its library
was built with, and every later import would compile it again.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oracle.paths import DEFAULT_CACHE
from oracle.pch import HEADER as FULL_PCH, LITE_BINDING

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
    pch_used: bool = False  # a C++ half was compiled against a precompiled header
    pch_wanted: list[dict[str, Any]] = field(default_factory=list)  # PchSpec.to_json() of headers to make
    cuda_header: str | None = None  # the header rung CUDA sources built with: lite, types, as written (None: not tried)
    binding_header: str | None = None  # what main.cpp (the Python binding) built against: lite or full (None: no load_inline)


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


FULL_HEADER = "#include <torch/extension.h>"
LIGHT_HEADER = "#include <torch/types.h>"
# The `lite` rung: a subset of what torch/extension.h declares, so that a source which compiles against it
# means the same as against the full header. Every overload of an operator is declared in that operator's
# own ATen/ops header, so an operator is either wholly here or missing (a compile error, then the next rung).
# On the 2-core CPU machine nvcc took 13.6 s on a kernel against it, 29.4 s against torch/types.h (median of 4).
LITE_HEADER = """// torch/extension.h, cut by kernelsearch to what CUDA kernels' glue uses (oracle/build.py)
#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/full.h>
#include <ATen/ops/full_like.h>
#include <optional>
namespace torch {
using namespace at;
using std::nullopt;
using std::optional;
using Dtype = at::ScalarType;
inline constexpr auto kUInt8 = at::kByte, kInt8 = at::kChar, kInt16 = at::kShort, kInt32 = at::kInt, kInt64 = at::kLong;
inline constexpr auto kUInt16 = at::kUInt16, kUInt32 = at::kUInt32, kUInt64 = at::kUInt64;
inline constexpr auto kFloat16 = at::kHalf, kFloat32 = at::kFloat, kFloat64 = at::kDouble;
inline constexpr auto kU8 = kUInt8, kU16 = kUInt16, kU32 = kUInt32, kU64 = kUInt64;
inline constexpr auto kI8 = kInt8, kI16 = kInt16, kI32 = kInt32, kI64 = kInt64;
inline constexpr auto kF16 = kFloat16, kF32 = kFloat32, kF64 = kFloat64;  // inline: no unused-variable warnings
}  // namespace torch"""
# main.cpp, the Python binding load_inline writes, against the same subset plus what binding a function to
# Python takes: pybind11 with PyTorch's type casters (torch/csrc/utils/pybind.h, where every caster that
# torch/extension.h brings is declared) and torch::wrap_pybind_function (torch/csrc/Exceptions.h); not the C++
# frontend of torch/all.h (nn, optim, data, jit). On the 2-core CPU machine g++ -O3 took 12-17 s on a binding
# file against it, 17.7 s against a precompiled torch/extension.h and 32.9 s against torch/extension.h.
LITE_BINDING_HEADER = LITE_HEADER + """
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/Exceptions.h>"""
# What load_inline puts first in main.cpp and before CUDA sources, when its implicit headers are left out.
IMPLICIT_CUDA_PRELUDE = "#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>"
# The rungs tried in turn for CUDA sources, lightest first; after the last, the source as written.
HEADER_RUNGS = {"lite": LITE_HEADER, "types": LIGHT_HEADER}
AS_WRITTEN = "as written"  # a folder's choice once every rung failed
# Errors that say a declaration is missing: what the lighter header can cause and the full one cures.
MISSING_DECLARATION = ("has no member", "is undefined", "was not declared", "not a member", "incomplete type",
                       "No such file", "is not a template", "undefined reference", "no instance of")


def lighten_cuda_sources(sources: list[str], rung: str = "lite") -> list[str] | None:
    """The CUDA sources with `torch/extension.h` replaced by the rung's header, or None when that cannot help
    (the header is not included) or may not be enough (the source binds functions to Python itself)."""
    if not any(FULL_HEADER in s for s in sources):
        return None
    if any("PYBIND11" in s or "pybind11" in s or "py::" in s or "TORCH_LIBRARY" in s for s in sources):
        return None
    return [s.replace(FULL_HEADER, HEADER_RUNGS[rung]) for s in sources]


# What load_inline puts before CUDA sources, less torch/types.h (the `lite` rung's header replaces it).
LITE_PRELUDE = "#include <cuda.h>\n#include <cuda_runtime.h>"


def without_full_header(sources: list[str]) -> list[str]:
    """C++ sources after a first header that stands for torch/extension.h: their own includes of it dropped.
    As written, main.cpp starts with torch/extension.h, so any later include of it adds nothing either."""
    return [s.replace(FULL_HEADER, "") for s in sources]


def failed_object(text: str, name: str) -> bool:
    """Whether a load_inline error says that ninja failed on the object `name` (`main.o`, `cuda.cuda.o`)."""
    return re.search(rf"^FAILED: (?:\[code=\d+\] )?{re.escape(name)}\b", text, re.M) is not None


# The compiler driver refusing its command line (a g++ option given to nvcc's flags, or the reverse): the flags
# are the same at every rung, so no other header can help and the build fails at once.
_REJECTED_FLAGS = re.compile(r"^(?:\S*: error: unrecognized command[- ]line option|nvcc fatal\s*: (?:Unknown option|"
                             r"Unsupported gpu architecture|Value '.*' is not defined for option))", re.M)


def flags_rejected(text: str) -> bool:
    """Whether a build error is the compiler rejecting its flags rather than the source (`_REJECTED_FLAGS`)."""
    return _REJECTED_FLAGS.search(text) is not None


def takes_no_implicit_headers(load_inline: Any) -> bool:
    """Whether this torch's (unhooked) load_inline can leave out its own torch/types.h, a newer argument:
    without it, the `lite` rung would parse torch/types.h all the same."""
    import inspect

    return "no_implicit_headers" in inspect.signature(load_inline).parameters


def lite_binding_available() -> bool:
    """Whether builds here try main.cpp against `LITE_BINDING_HEADER` first (`takes_no_implicit_headers`)."""
    import torch.utils.cpp_extension as cpp

    return takes_no_implicit_headers(cpp.load_inline)


def _next_rung(rung: str | None) -> str | None:
    """The rung after `rung`; None after the last (the source as written comes next)."""
    names = list(HEADER_RUNGS)
    after = names.index(rung) + 1 if rung in names else len(names)
    return names[after] if after < len(names) else None


def with_build_flags(call: dict[str, Any]) -> dict[str, Any]:
    """A load_inline/load call as it is built: flags it leaves out are `BUILD_FLAGS`'s. Headers are keyed
    by these flags, so whoever asks for a header ahead of a build must ask through here too."""
    for k in ("extra_cflags", "extra_cuda_cflags"):
        if call.get(k) is None:
            call[k] = list(BUILD_FLAGS["cflags" if k == "extra_cflags" else "cuda_cflags"])
    return call


def install_build_hooks(cache: Path, gpu_arch: str | None, record: BuildRecord, pch: Path | None = None) -> None:
    """Patch `load_inline`/`load` in this (worker) process to build into the keyed cache folders.
    `pch`: the folder of precompiled headers (`oracle.pch`), or None to build without them."""
    import inspect

    import torch.utils.cpp_extension as cpp

    if gpu_arch:
        os.environ["TORCH_CUDA_ARCH_LIST"] = gpu_arch  # only the present GPU: a build for all is several times slower
    os.environ.setdefault("MAX_JOBS", str(max(1, (os.cpu_count() or 2))))
    original_inline, original_load = cpp.load_inline, cpp.load
    first_rung = "lite" if takes_no_implicit_headers(original_inline) else "types"

    def build(original, *args: Any, **kwargs: Any) -> Any:
        bound = inspect.signature(original).bind(*args, **kwargs)
        call = with_build_flags(dict(bound.arguments))
        if original is original_load:  # sources are files: key their contents
            call["_contents"] = [Path(p).read_text(errors="replace") for p in _as_list(call.get("sources"))]
        key = extension_key(call, gpu_arch)
        call.pop("_contents", None)
        unique = f"{_safe_name(str(call.get('name', 'ext')))}_{key[:12]}"
        build_dir = cache / "ext" / key
        build_dir.mkdir(parents=True, exist_ok=True)
        call.update(name=unique, build_directory=str(build_dir), verbose=False)
        with _folder_held(build_dir):  # another process building this folder: wait, then load what it built
            before = _newest_library(build_dir)
            choices = _build_choices(build_dir, call, original is original_inline, pch, record, first_rung)
            t0 = time.perf_counter()
            while True:
                try:
                    module = original(**_apply_choices(call, choices))
                    break
                except Exception as exc:  # noqa: BLE001 - the compiler's message is the useful part
                    text = str(exc)
                    if flags_rejected(text):
                        record.error = trim_compiler_output(text)
                        raise BuildFailed(record.error) from None
                    # main.cpp failed against the lite binding header: torch/extension.h next, the CUDA
                    # file's rung kept unless it failed too
                    binding = choices.get("binding") == "lite" and failed_object(text, "main.o")
                    if binding:
                        choices["binding"] = "full"
                        choices["failed"] = [*choices.get("failed", []), "binding"]
                        _choose_header(choices, call, pch, record)
                    if not binding or failed_object(text, "cuda.cuda.o"):
                        rung = _rung(choices)
                        # Past `lite`, any error sends the source to torch/types.h, whose verdicts are the ones
                        # a build had before the rung existed; past torch/types.h only a missing declaration does.
                        if rung is None or (rung != "lite" and not any(m in text for m in MISSING_DECLARATION)):
                            record.error = trim_compiler_output(text)
                            raise BuildFailed(record.error) from None
                        # the lighter header was not enough: the next rung, or the source as written
                        choices.pop("light", None)
                        choices["failed"] = [*choices.get("failed", []), rung]
                        choices["header"] = _next_rung(rung) or AS_WRITTEN
                    _save_choices(build_dir, choices)
            after = _newest_library(build_dir)
        if record.cuda_header is None and ("header" in choices or "light" in choices):
            record.cuda_header = _rung(choices) or AS_WRITTEN
        if record.binding_header is None and original is original_inline:
            record.binding_header = choices.get("binding", "full")
        if after != before:
            record.compiled = True
            record.build_s += time.perf_counter() - t0
            record.pch_used = record.pch_used or bool(choices.get("pch"))
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


def _build_choices(build_dir: Path, call: dict[str, Any], inline: bool, pch: Path | None,
                   record: BuildRecord, first_rung: str = "lite") -> dict[str, Any]:
    """How this extension is compiled: decided once, when its folder is first built, and kept in the folder.
    A later import must pass the same flags and sources, or ninja would rebuild it. A first rung of `lite`
    (this torch's load_inline can leave out its own headers) also tries main.cpp against
    `LITE_BINDING_HEADER` first."""
    saved = build_dir / "choices.json"
    if saved.exists() and _newest_library(build_dir) is not None:
        try:
            return json.loads(saved.read_text())
        except (OSError, ValueError):
            return {}
    choices: dict[str, Any] = {}
    # a call that leaves out load_inline's own headers has chosen its headers itself
    inline = inline and not call.get("no_implicit_headers")
    cuda_sources = _as_list(call.get("cuda_sources")) if inline else []
    if cuda_sources and lighten_cuda_sources(cuda_sources) is not None:
        choices["header"] = first_rung
    if inline and first_rung == "lite":
        choices["binding"] = "lite"  # pybind11 and the casters still parse: against their own precompiled header
        _choose_header(choices, call, pch, record, LITE_BINDING)
    elif inline:
        _choose_header(choices, call, pch, record)
    _save_choices(build_dir, choices)
    return choices


def _choose_header(choices: dict[str, Any], call: dict[str, Any], pch: Path | None, record: BuildRecord,
                   header: str = FULL_PCH) -> None:
    """main.cpp against `header` (torch/extension.h, or the lite binding header): its precompiled header when
    one is ready for the call's flags (`choices["pch"]`, the folder), else asked for (`record.pch_wanted`),
    for the builds after this one."""
    choices.pop("pch", None)
    if pch is None:
        return
    from oracle.pch import header_folder, is_ready, spec_for

    spec = spec_for(call.get("extra_cflags"), call.get("extra_include_paths"),
                    with_cuda=bool(_as_list(call.get("cuda_sources"))), header=header)
    if spec is not None and is_ready(pch, spec):
        choices["pch"] = str(header_folder(pch, spec))
    elif spec is not None:
        record.pch_wanted.append(spec.to_json())


def _save_choices(build_dir: Path, choices: dict[str, Any]) -> None:
    """Written whole or not at all: a reader never meets half a file (it would read no choices, and build
    with other flags than the library's)."""
    part = build_dir / f"choices.json.{os.getpid()}"
    part.write_text(json.dumps(choices))
    os.replace(part, build_dir / "choices.json")


@contextlib.contextmanager
def _folder_held(build_dir: Path):
    """One process at a time decides, builds and loads an extension folder. PyTorch's own lock covers its
    compile only: a second process that waited on it loads the library the first built, while the choices
    it saved (with or without a precompiled header, say) stay in the folder, and the next import finds
    flags that differ from the library's and compiles it again (20 s of a check on an H200, in its device
    slot). The kernel lets go of the lock when its process ends, a killed build's too."""
    with open(build_dir / "folder.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)



def _rung(choices: dict[str, Any]) -> str | None:
    """The header rung a folder's choices name (None: the source as written). Folders built before the
    `lite` rung say `light: true` for torch/types.h and `light: false` for as written."""
    if "header" in choices:
        return choices["header"] if choices["header"] in HEADER_RUNGS else None
    return "types" if choices.get("light") else None


def _apply_choices(call: dict[str, Any], choices: dict[str, Any]) -> dict[str, Any]:
    out = dict(call)
    lite_binding = choices.get("binding") == "lite"
    if choices.get("pch"):
        # -I folders are searched before PyTorch's -isystem ones, so gcc meets the .gch first
        out["extra_cflags"] = [*_as_list(call.get("extra_cflags")), f"-I{choices['pch']}"]
    rung = _rung(choices)
    cuda_sources = _as_list(call.get("cuda_sources"))
    if rung is not None:
        cuda_sources = out["cuda_sources"] = lighten_cuda_sources(cuda_sources, rung)
    if rung == "lite" or lite_binding:
        # load_inline's own first lines left out (torch/types.h before CUDA sources, torch/extension.h
        # first in main.cpp, the only place where its precompiled header is used) and put back as chosen
        out["no_implicit_headers"] = True
        if cuda_sources:
            out["cuda_sources"] = [LITE_PRELUDE if rung == "lite" else IMPLICIT_CUDA_PRELUDE, *cuda_sources]
        cpp_sources = _as_list(call.get("cpp_sources"))
        binding = f"#include <{LITE_BINDING}>" if choices.get("pch") else LITE_BINDING_HEADER
        out["cpp_sources"] = ([binding, *without_full_header(cpp_sources)] if lite_binding
                              else [FULL_HEADER, *cpp_sources])
    # A rung after a failed one gets its own name, so that PyTorch does not rename it to `_v1` in this
    # process only; the first one tried (and a folder from before the ladder) keeps the plain name.
    failed = choices.get("failed") or []
    parts = ["asis" if rung is None else rung] if any(f in HEADER_RUNGS for f in failed) else []
    parts += ["full"] if "binding" in failed else []
    if parts:
        out["name"] = "_".join([call["name"], *parts])
    elif choices.get("light") is False:
        out["name"] = f"{call['name']}_asis"
    return out


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


# ---------------------------------------------------------------- the candidate build cache (trusted side)


@dataclass
class BuildOutcome:
    key: str
    key_dir: Path
    ok: bool
    cached: bool
    build_s: float
    status: str | None = None  # a final verdict status when the build decided it (compile_error, timeout, ...)
    message: str = ""
    pch_used: bool = False  # the C++ half used a precompiled header
    cuda_header: str | None = None  # the header rung CUDA sources built with (None: not applicable)
    binding_header: str | None = None  # what main.cpp (the Python binding) built against: lite or full


# Per file a build worker writes (the extension's .so, the compiler's files): room enough, not a full disk.
BUILD_FILE_CAP = 2 * 1024**3


class CandidateBuilds:
    """Builds each candidate once, in a worker with the device hidden, and remembers the outcome on disk
    (`<cache>/builds/candidates/<key>/ok.json` or `failed.json`), across runs too."""

    def __init__(self, root: Path, gpu_arch: str | None, pch: Path | None, timeout_s: float, quiet) -> None:
        self.root = root
        self.gpu_arch = gpu_arch
        self.pch = pch
        self.timeout_s = timeout_s
        self.quiet = quiet  # oracle.device_quiet.QuietDevice: builds are stopped while a CPU is timed

    def build(self, source: str, backend: str) -> BuildOutcome:
        from oracle import harness  # the worker's side imports this module
        from oracle.pch import PchSpec, request_header
        from oracle.protocol import BuildJob, BuildResult
        from oracle.sandbox import Worker, run_to_result

        key = build_key(source, backend, self.gpu_arch)
        key_dir = self.root / "candidates" / key
        ok_file, failed_file = key_dir / "ok.json", key_dir / "failed.json"
        if ok_file.exists():
            data = _read_json(ok_file)  # how the binary was built, for the verdict
            return BuildOutcome(key, key_dir, True, True, 0.0, pch_used=bool(data.get("pch_used")),
                                cuda_header=data.get("cuda_header"), binding_header=data.get("binding_header"))
        if failed_file.exists():
            data = json.loads(failed_file.read_text())
            return BuildOutcome(key, key_dir, False, True, 0.0, "compile_error", data["message"])
        if backend not in ("cuda", "cpp"):
            return BuildOutcome(key, key_dir, True, False, 0.0)  # nothing to compile ahead of the run
        key_dir.mkdir(parents=True, exist_ok=True)
        job = BuildJob(cache=str(self.root), gpu_arch=self.gpu_arch, candidate_path="candidate.py",
                       pch=str(self.pch) if self.pch else None, backend=backend, build_timeout_s=self.timeout_s,
                       max_file_bytes=BUILD_FILE_CAP)
        # CUDA hidden: a build slot compiles only, the GPU stays with the device slots.
        worker = Worker(harness.build_entry, job.to_json(), {"candidate.py": source}, env={"CUDA_VISIBLE_DEVICES": ""},
                        placement=self.quiet.build_placement)
        with self.quiet.building(worker):
            outcome = run_to_result(worker)
        if outcome.timed_out_phase:
            return BuildOutcome(key, key_dir, False, False, outcome.elapsed_s, "timeout",
                                f"building took longer than {self.timeout_s:.0f} s")
        try:
            r = BuildResult.from_json(outcome.result)
        except ValueError:
            return BuildOutcome(key, key_dir, False, False, outcome.elapsed_s, "runtime_error",
                                f"the build worker {outcome.crashed or 'sent no result'}: {last_line(outcome.stderr_tail)}")
        if self.pch is not None and r.error_kind is None:  # flags that built: worth a header
            for wanted in r.pch_wanted:  # made beside the search, for the builds after this one
                maker = request_header(self.pch, PchSpec.from_json(wanted))
                if maker is not None:
                    self.quiet.header_maker(maker)
        if r.error_kind == "compile":
            failed_file.write_text(json.dumps({"message": r.message, "build_s": r.build_s}))
            return BuildOutcome(key, key_dir, False, False, r.build_s, "compile_error", r.message)
        if r.error_kind is None:
            ok_file.write_text(json.dumps({"build_s": r.build_s, "extensions": r.extensions, "pch_used": r.pch_used,
                                           "cuda_header": r.cuda_header, "binding_header": r.binding_header}))
        # An import error that is not the compiler's is left to the run, which imports with the device present.
        return BuildOutcome(key, key_dir, True, not r.compiled, r.build_s, pch_used=r.pch_used,
                            cuda_header=r.cuda_header, binding_header=r.binding_header)

    def request_default_header(self, with_cuda: bool, header: str = FULL_PCH) -> bool:
        """Start making the precompiled `header` for `load_inline`'s default flags now, so that it is ready for
        the first builds instead of only for those that start after the first build ends (in a cold run the
        first waves of builds would all parse it from scratch). The header of a candidate that passes flags
        of its own is still asked for by its first build. Returns whether a maker started."""
        from oracle.pch import request_header, spec_for

        if self.pch is None:
            return False
        spec = spec_for(with_build_flags({})["extra_cflags"], None, with_cuda=with_cuda, header=header)
        try:
            maker = request_header(self.pch, spec) if spec is not None else None
        except OSError:  # a header folder it cannot write: builds go on without headers, the oracle starts
            return False
        if maker is not None:
            self.quiet.header_maker(maker)
        return maker is not None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def last_line(text: str) -> str:
    """The last non-empty line of a worker's stderr, for a one-line message."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no output"
