"""Every CUDA candidate's source compiles with nvcc (compile only, no GPU needed), or fails where it must.

The CUDA candidates (tests/adversarial/gpu/ and benchmarks/candidates/) only ever build on the GPU machine,
so a syntax or type error in one would first show there. This runs nvcc's front ends over the CUDA source of
each `load_inline(..., cuda_sources=...)` call, as `load_inline` would compile it (the same prelude and
nvcc flags, against the torch headers of this environment), without linking or loading anything: host code
is checked by cudafe++ and device code by cicc/ptxas for sm_90. Skipped when nvcc is not on PATH.

Parsing torch's headers costs tens of seconds per translation unit on 2 cores, so the distinct sources that
must compile go through nvcc together, each in a namespace of its own (includes hoisted, macros undefined
after it); only if that one compile fails is each compiled alone, to name the broken ones. A candidate whose
first line expects `compile_error` is compiled alone and must fail.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import re
import shutil
import subprocess
import sysconfig
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
NVCC = shutil.which("nvcc")
FILES = sorted((ROOT / "tests" / "adversarial" / "gpu").glob("*.py")) + sorted((ROOT / "benchmarks" / "candidates").glob("level*/*/*.py"))
PRELUDE = "#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n"  # what load_inline puts first
TIMEOUT_S = 1800

# Declarations-only stand-ins for headers that torch's CUDA headers include but a minimal CUDA toolkit (or
# torch's CPU wheel) lacks: used only where the real header is missing. Candidates that call these
# libraries themselves would fail here; ours leave GEMMs and convolutions to PyTorch.
STUBS = {
    "cusparse.h": "typedef struct cusparseContext* cusparseHandle_t;\n"
                  "typedef enum { CUSPARSE_STATUS_SUCCESS = 0 } cusparseStatus_t;\n"
                  "const char* cusparseGetErrorString(cusparseStatus_t status);\n",
    "cublas_v2.h": "typedef struct cublasContext* cublasHandle_t;\ntypedef enum { CUBLAS_STATUS_SUCCESS = 0 } cublasStatus_t;\n",
    "cublasLt.h": "#include <cublas_v2.h>\ntypedef struct cublasLtContext* cublasLtHandle_t;\n",
    "cusolver_common.h": "typedef enum { CUSOLVER_STATUS_SUCCESS = 0, CUSOLVER_STATUS_INVALID_VALUE = 3 } cusolverStatus_t;\n",
    "cusolverDn.h": "#include <cusolver_common.h>\ntypedef struct cusolverDnContext* cusolverDnHandle_t;\n",
    "c10/cuda/impl/cuda_cmake_macros.h": "#define C10_CUDA_BUILD_SHARED_LIBS\n",
}


def cuda_sources(path: Path) -> list[str]:
    """The CUDA source text of each `load_inline` call in the module (string constants, or names of them)."""
    tree = ast.parse(path.read_text())
    strings: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    strings[target.id] = node.value.value

    def text(node: ast.expr) -> list[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, ast.Name) and node.id in strings:
            return [strings[node.id]]
        if isinstance(node, (ast.List, ast.Tuple)):
            return [s for element in node.elts for s in text(element)]
        raise AssertionError(f"{path}: cannot read cuda_sources={ast.unparse(node)} statically")

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] == "load_inline":
            for kw in node.keywords:
                if kw.arg == "cuda_sources":
                    found.append("\n".join(text(kw.value)))
    return found


def expects_compile_error(path: Path) -> bool:
    first = path.read_text().splitlines()[0]
    match = re.match(r"#\s*(?:expect|expected verdict):\s*([a-z_/]+)", first)
    return bool(match) and match.group(1).split("/") == ["compile_error"]


CASES = [(f, s) for f in FILES for s in cuda_sources(f)]


def _digest(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def _include_args(stub_dir: Path) -> list[str]:
    import torch.utils.cpp_extension as cpp

    torch_inc = Path(cpp.include_paths()[0])
    dirs = [torch_inc, torch_inc / "torch" / "csrc" / "api" / "include", Path(sysconfig.get_paths()["include"])]
    toolkit = Path(NVCC).resolve().parent.parent
    cuda_incs = [toolkit / "include", *toolkit.glob("targets/*/include")]
    missing = {name: body for name, body in STUBS.items()
               if not any((d / name).exists() for d in [*cuda_incs, torch_inc])}
    for name, body in missing.items():
        (stub_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (stub_dir / name).write_text("#pragma once\n" + body)
    return [arg for d in dirs for arg in ("-I", str(d))] + (["-isystem", str(stub_dir)] if missing else [])


def _std_flag() -> str:
    """The C++ standard torch's own extension builds use (C++20 from torch 2.10 on, C++17 before)."""
    import torch.utils.cpp_extension as cpp

    return "-std=c++20" if "-std=c++20" in inspect.getsource(cpp) else "-std=c++17"


def _nvcc(unit: str, work: Path, name: str, includes: list[str]) -> tuple[bool, str]:
    src = work / f"{name}.cu"
    src.write_text(unit)
    args = [NVCC, "-cuda", _std_flag(), "-arch=sm_90", "-DTORCH_API_INCLUDE_EXTENSION_H", f"-DTORCH_EXTENSION_NAME={name}",
            "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__", "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
            "-D__CUDA_NO_HALF2_OPERATORS__", "--expt-relaxed-constexpr", "-w", "-o", str(work / f"{name}.ii")]
    args += [*includes, str(src)]
    out = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT_S)
    return out.returncode == 0, (out.stdout + out.stderr)[-3000:]


def _combined(sources: list[str], prelude: str = PRELUDE) -> str:
    """One translation unit of many sources: includes first, each source's code in its own namespace."""
    includes: list[str] = []
    bodies: list[str] = []
    for i, source in enumerate(sources):
        lines = source.splitlines()
        heads = [line for line in lines if re.match(r"\s*#\s*include\b", line)]
        body = [line for line in lines if not re.match(r"\s*#\s*include\b", line)]
        macros = re.findall(r"^\s*#\s*define\s+(\w+)", source, flags=re.M)
        includes += [h for h in heads if h not in includes]
        bodies.append(f"namespace ks_source_{i} {{\n" + "\n".join(body) + "\n}\n" + "".join(f"#undef {m}\n" for m in macros))
    return prelude + "\n".join(includes) + "\n" + "\n".join(bodies)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict[str, tuple[bool, str]]:
    """digest -> (compiled, compiler output), for every distinct CUDA source."""
    if NVCC is None:
        pytest.skip("nvcc is not on PATH")
    work = tmp_path_factory.mktemp("nvcc")
    includes = _include_args(Path(tempfile.mkdtemp(dir=work)))
    must_fail: dict[str, str] = {}
    must_build: dict[str, str] = {}
    for path, source in CASES:
        (must_fail if expects_compile_error(path) else must_build)[_digest(source)] = source
    results: dict[str, tuple[bool, str]] = {}
    with ThreadPoolExecutor(max_workers=2) as pool:
        batch = pool.submit(_nvcc, _combined(list(must_build.values())), work, "all_sources", includes)
        alone = {d: pool.submit(_nvcc, PRELUDE + s, work, f"src_{d}", includes) for d, s in must_fail.items()}
        ok, _ = batch.result()
        if ok:
            results.update({d: (True, "") for d in must_build})
        else:  # name the broken ones
            alone.update({d: pool.submit(_nvcc, PRELUDE + s, work, f"src_{d}", includes) for d, s in must_build.items()})
        results.update({d: f.result() for d, f in alone.items()})
    return results


@pytest.fixture(scope="module")
def compiled_lite(tmp_path_factory) -> tuple[bool, str]:
    """Every CUDA source that must build, as a build's first header rung gives it to nvcc: the `lite` header in
    place of torch/extension.h and load_inline's own torch/types.h left out (oracle/build.py)."""
    if NVCC is None:
        pytest.skip("nvcc is not on PATH")
    from oracle.build import LITE_PRELUDE, lighten_cuda_sources

    work = tmp_path_factory.mktemp("nvcc_lite")
    includes = _include_args(Path(tempfile.mkdtemp(dir=work)))
    lite = {}
    for path, source in CASES:
        lightened = lighten_cuda_sources([source], "lite")
        if not expects_compile_error(path) and lightened is not None:
            lite[_digest(source)] = lightened[0]
    assert len(lite) >= 40
    return _nvcc(_combined(list(lite.values()), LITE_PRELUDE + "\n"), work, "all_lite", includes)


def test_every_candidate_builds_with_the_lightest_header(compiled_lite):
    """None of the corpus pays for a fallback to torch/types.h (a failed first rung costs a front-end parse)."""
    ok, log = compiled_lite
    assert ok, f"a CUDA source does not compile against oracle.build.LITE_HEADER:\n{log}"


def test_every_cuda_candidate_is_covered():
    assert len({_digest(s) for _, s in CASES}) >= 40
    assert any(expects_compile_error(p) for p, _ in CASES)


@pytest.mark.parametrize("path,source", CASES, ids=[str(p.relative_to(ROOT)) for p, _ in CASES])
def test_cuda_source_compiles(compiled, path, source):
    ok, log = compiled[_digest(source)]
    if expects_compile_error(path):
        assert not ok, f"{path.relative_to(ROOT)} expects compile_error, but its CUDA source compiles"
    else:
        assert ok, f"{path.relative_to(ROOT)}: nvcc failed:\n{log}"
