"""The two cuts to cold build time (oracle/pch.py, oracle/build.py): a precompiled torch/extension.h for the
C++ half, lighter headers for CUDA sources (the `lite` rung, then torch/types.h). Fast tests of the decisions; slow ones build for real on the CPU."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from oracle import Oracle, OracleConfig
from oracle.build import BuildRecord, _apply_choices, _build_choices, lighten_cuda_sources
from oracle.pch import PchSpec, header_folder, is_ready, request_header, spec_for
from tasks import Selection, load_tasks

ROOT = Path(__file__).resolve().parent.parent
LEAKY = ROOT / "tests" / "candidates" / "leaky_correct.py"

KERNEL = """#include <torch/extension.h>
__global__ void k(float* y) { y[threadIdx.x] = 1.f; }
torch::Tensor run(torch::Tensor x) { auto y = torch::empty_like(x); k<<<1, 32>>>(y.data_ptr<float>()); return y; }
"""


def test_cuda_sources_get_the_lighter_headers():
    assert lighten_cuda_sources([KERNEL], "types") == [KERNEL.replace("<torch/extension.h>", "<torch/types.h>")]
    lite = lighten_cuda_sources([KERNEL])[0]  # the lightest rung first
    assert "#include <torch/extension.h>" not in lite and "#include <torch/types.h>" not in lite
    assert "#include <ATen/core/Tensor.h>" in lite


def test_sources_that_need_the_full_header_keep_it():
    assert lighten_cuda_sources(["#include <cuda_runtime.h>\n__global__ void k() {}"]) is None  # nothing to lighten
    binds = KERNEL + "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def(\"run\", &run); }"
    assert lighten_cuda_sources([binds]) is None  # pybind11 lives in the full header


def test_spec_reads_pytorchs_own_flags_without_the_extension_name():
    spec = spec_for(["-O3"], None, with_cuda=False)
    assert spec is not None
    assert "-O3" in spec.cflags and "-fPIC" in spec.cflags
    assert not any(f.startswith("-DTORCH_EXTENSION_NAME") for f in spec.cflags)
    assert spec.key == spec_for(["-O3"], None, with_cuda=False).key
    assert spec.key != spec_for(["-O2"], None, with_cuda=False).key  # flags that change code change the header
    assert spec.torch and spec.key != PchSpec(spec.cxx, spec.cflags, "0.0").key  # so does another torch


def test_choices_are_kept_with_the_built_extension(tmp_path):
    """An extension's flags must not change between the build and later imports, or ninja rebuilds it."""
    build_dir = tmp_path / "ext"
    build_dir.mkdir()
    call = {"name": "x", "cuda_sources": [KERNEL], "extra_cflags": ["-O3"]}
    record = BuildRecord()
    first = _build_choices(build_dir, call, True, None, record)
    assert first == {"header": "lite"}
    (build_dir / "x.so").write_text("")  # built
    (build_dir / "choices.json").write_text(json.dumps({"header": "as written", "failed": ["lite", "types"], "pch": "/somewhere"}))
    assert _build_choices(build_dir, call, True, None, record)["header"] == "as written"
    applied = _apply_choices(call, {"header": "as written", "failed": ["lite", "types"], "pch": "/somewhere"})
    assert applied["extra_cflags"] == ["-O3", "-I/somewhere"] and applied["cuda_sources"] == [KERNEL]
    assert applied["name"] == "x_asis"  # a rung after a failed one has its own name
    lite = _apply_choices(call, first)
    assert lite["name"] == "x" and lite["no_implicit_headers"] is True  # load_inline's torch/types.h left out too
    assert "#include <cuda_runtime.h>" in lite["cuda_sources"][0] and "ATen/core/Tensor.h" in lite["cuda_sources"][1]
    types = _apply_choices(call, {"header": "types", "failed": ["lite"]})
    assert types["name"] == "x_types" and types["cuda_sources"][0].startswith("#include <torch/types.h>")
    assert "no_implicit_headers" not in types
    # folders built before the lite rung existed keep their names and headers
    assert _apply_choices(call, {"light": True})["cuda_sources"][0].startswith("#include <torch/types.h>")
    assert _apply_choices(call, {"light": True})["name"] == "x"
    assert _apply_choices(call, {"light": False})["name"] == "x_asis"


def test_a_missing_header_is_requested_not_used(tmp_path):
    record = BuildRecord()
    build_dir = tmp_path / "ext"
    build_dir.mkdir()
    choices = _build_choices(build_dir, {"name": "x", "cpp_sources": ["int f();"], "extra_cflags": ["-O3"]}, True,
                             tmp_path / "pch", record)
    assert "pch" not in choices
    assert record.pch_wanted and PchSpec.from_json(record.pch_wanted[0]) == spec_for(["-O3"], None, with_cuda=False)


@pytest.mark.slow
def test_header_is_made_in_the_background_and_used_by_the_next_build(tmp_path):
    pch = tmp_path / "pch"
    task = load_tasks("builtin", Selection(task_ids=frozenset({"builtin/1_LeakyReLU_Scale"})), 256).tasks[0]
    source = LEAKY.read_text()

    first = Oracle(OracleConfig(device="cpu", cache_dir=tmp_path / "a", pch_dir=pch))
    built = first.build(first.extract(task, source))
    assert built.ok and not built.pch_used  # no header yet: built the ordinary way, and one was asked for
    spec = spec_for(["-O3"], None, with_cuda=False)
    deadline = time.monotonic() + 600
    while not is_ready(pch, spec) and time.monotonic() < deadline:
        time.sleep(2)
    assert is_ready(pch, spec), (pch / f"{spec.key}.log").read_text() if (pch / f"{spec.key}.log").exists() else "no log"
    assert (header_folder(pch, spec) / "torch" / "extension.h.gch").stat().st_size > 1_000_000
    assert not request_header(pch, spec)  # made: not asked for again

    second = Oracle(OracleConfig(device="cpu", cache_dir=tmp_path / "b", pch_dir=pch, timing=first.config.timing))
    candidate = second.extract(task, source)
    build = second.build(candidate)
    assert build.ok and build.pch_used and not build.cached
    library = max((tmp_path / "b").rglob("*.so"), key=lambda p: p.stat().st_mtime)
    stamp = library.stat().st_mtime
    verdict = second.check_and_time(task, candidate, build)
    assert verdict.status == "correct", verdict.message
    assert library.stat().st_mtime == stamp  # the check imported what was built, it did not rebuild
