"""The two cuts to cold build time (oracle/pch.py, oracle/build.py): a precompiled torch/extension.h for the
C++ half, lighter headers for CUDA sources (the `lite` rung, then torch/types.h). Fast tests of the decisions; slow ones build for real on the CPU."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from oracle import Oracle, OracleConfig
from oracle.build import (LITE_BINDING_HEADER, BuildRecord, _apply_choices, _build_choices, failed_object,
                          flags_rejected, lighten_cuda_sources)
from oracle.pch import LITE_BINDING, PchSpec, header_folder, is_ready, make_header, request_header, spec_for
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
    lite = spec_for(["-O3"], None, with_cuda=False, header=LITE_BINDING)
    assert lite.cflags == spec.cflags and lite.key != spec.key  # the lite binding header is a header of its own
    assert PchSpec.from_json(lite.to_json()) == lite
    assert PchSpec.from_json({k: v for k, v in spec.to_json().items() if k != "header"}) == spec  # as asked before
    with pytest.raises(ValueError):
        PchSpec.from_json({**spec.to_json(), "header": "../../etc/passwd"})  # only the headers it knows


def test_choices_are_kept_with_the_built_extension(tmp_path):
    """An extension's flags must not change between the build and later imports, or ninja rebuilds it."""
    build_dir = tmp_path / "ext"
    build_dir.mkdir()
    call = {"name": "x", "cuda_sources": [KERNEL], "cpp_sources": "int f();", "extra_cflags": ["-O3"]}
    record = BuildRecord()
    first = _build_choices(build_dir, call, True, None, record)
    assert first == {"header": "lite", "binding": "lite"}
    (build_dir / "x.so").write_text("")  # built
    (build_dir / "choices.json").write_text(json.dumps({"header": "as written", "failed": ["lite", "types"], "pch": "/somewhere"}))
    assert _build_choices(build_dir, call, True, None, record)["header"] == "as written"
    applied = _apply_choices(call, {"header": "as written", "failed": ["lite", "types"], "pch": "/somewhere"})
    assert applied["extra_cflags"] == ["-O3", "-I/somewhere"] and applied["cuda_sources"] == [KERNEL]
    assert applied["name"] == "x_asis"  # a rung after a failed one has its own name
    lite = _apply_choices(call, first)
    assert lite["name"] == "x" and lite["no_implicit_headers"] is True  # load_inline's torch/types.h left out too
    assert "#include <cuda_runtime.h>" in lite["cuda_sources"][0] and "ATen/core/Tensor.h" in lite["cuda_sources"][1]
    # main.cpp's first line, which no_implicit_headers drops, is the lite binding header
    assert lite["cpp_sources"] == [LITE_BINDING_HEADER, "int f();"]
    # a binding after a failure there: torch/extension.h back as its first line (the precompiled header is
    # used only for a first include)
    full = _apply_choices(call, {"header": "lite", "binding": "full", "failed": ["binding"]})
    assert full["cpp_sources"] == ["#include <torch/extension.h>", "int f();"]
    types = _apply_choices(call, {"header": "types", "failed": ["lite"]})
    assert types["name"] == "x_types" and types["cuda_sources"][0].startswith("#include <torch/types.h>")
    assert "no_implicit_headers" not in types
    # folders built before the lite rung existed keep their names and headers
    assert _apply_choices(call, {"light": True})["cuda_sources"][0].startswith("#include <torch/types.h>")
    assert _apply_choices(call, {"light": True})["name"] == "x"
    assert _apply_choices(call, {"light": False})["name"] == "x_asis"


def test_bindings_are_tried_against_the_lite_header_first(tmp_path):
    """main.cpp starts with the lite binding header instead of torch/extension.h, its own includes of that
    dropped (they would add nothing after a first torch/extension.h); the lite header's precompiled header is
    asked for, and once made, included by name from its folder."""
    record = BuildRecord()
    (tmp_path / "a").mkdir()
    cpp_call = {"name": "x", "cpp_sources": ["#include <torch/extension.h>\nint f() { return 1; }"], "extra_cflags": ["-O3"]}
    choices = _build_choices(tmp_path / "a", cpp_call, True, tmp_path / "pch", record)
    assert choices == {"binding": "lite"}
    assert [PchSpec.from_json(w).header for w in record.pch_wanted] == [LITE_BINDING]
    applied = _apply_choices(cpp_call, choices)
    assert applied["no_implicit_headers"] is True and applied["name"] == "x"
    assert applied["cpp_sources"] == [LITE_BINDING_HEADER, "\nint f() { return 1; }"]
    assert "torch/csrc/utils/pybind.h" in LITE_BINDING_HEADER and "torch/extension.h>" not in LITE_BINDING_HEADER
    # with CUDA sources: each half gets its own header, and load_inline's own lines before the CUDA file
    cuda_call = {"name": "x", "cuda_sources": [KERNEL], "cpp_sources": "torch::Tensor run(torch::Tensor x);"}
    both = _apply_choices(cuda_call, {"header": "lite", "binding": "lite"})
    assert both["cpp_sources"] == [LITE_BINDING_HEADER, "torch::Tensor run(torch::Tensor x);"]
    assert both["cuda_sources"][0] == "#include <cuda.h>\n#include <cuda_runtime.h>"
    types = _apply_choices(cuda_call, {"header": "types", "failed": ["lite"], "binding": "lite"})
    assert types["no_implicit_headers"] is True and types["name"] == "x_types"
    assert types["cuda_sources"][0] == "#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>"
    # the binding after a failure at the lite header: torch/extension.h and its precompiled header, a name of its own
    full = _apply_choices(cuda_call, {"header": "lite", "binding": "full", "failed": ["binding"], "pch": "/p"})
    assert full["cpp_sources"][0] == "#include <torch/extension.h>" and full["extra_cflags"][-1] == "-I/p"
    assert full["name"] == "x_full"
    # the binding against the lite header's precompiled header: included by name, its folder first on the path
    precompiled = _apply_choices(cuda_call, {"header": "lite", "binding": "lite", "pch": "/p"})
    assert precompiled["cpp_sources"] == [f"#include <{LITE_BINDING}>", "torch::Tensor run(torch::Tensor x);"]
    assert precompiled["extra_cflags"][-1] == "-I/p" and precompiled["name"] == "x"
    # a call that leaves out load_inline's headers itself chose its own: nothing is changed
    (tmp_path / "b").mkdir()
    own = _build_choices(tmp_path / "b", {**cuda_call, "no_implicit_headers": True}, True, None, record)
    assert own == {}


def test_which_object_failed_is_read_from_ninjas_message():
    old = "Error building extension 'x': [1/3] c++ -c main.cpp -o main.o\nFAILED: main.o \nc++ ...\nerror: 'exp' is not a member"
    new = "Error building extension 'x': [1/3] c++ ...\nFAILED: [code=1] cuda.cuda.o \n/usr/local/cuda/bin/nvcc ..."
    assert failed_object(old, "main.o") and not failed_object(old, "cuda.cuda.o")
    assert failed_object(new, "cuda.cuda.o") and not failed_object(new, "main.o")
    assert not failed_object("undefined symbol: main.o", "main.o")


def test_a_rejected_flag_is_read_from_the_compilers_message():
    gxx = ("FAILED: [code=1] main.o \n/opt/gcc/bin/g++ -MMD -MF main.o.d -O3 --use_fast_math -c main.cpp\n"
           "g++-real: error: unrecognized command-line option \u2018--use_fast_math\u2019; did you mean \u2018--fast-math\u2019?")
    old_gcc = "FAILED: main.o \nc++: error: unrecognized command line option '-Xptxas=-O3'"
    nvcc = "FAILED: cuda.cuda.o \n/usr/local/cuda/bin/nvcc ... -ffast-math\nnvcc fatal   : Unknown option '-ffast-math'"
    arch = "FAILED: cuda.cuda.o \nnvcc fatal   : Value 'sm_999' is not defined for option 'gpu-architecture'"
    arch13 = "FAILED: cuda.cuda.o \nnvcc fatal   : Unsupported gpu architecture 'sm_999'"  # nvcc 13's words
    assert all(flags_rejected(t) for t in (gxx, old_gcc, nvcc, arch, arch13))
    source = ("FAILED: main.o \nmain.cpp:3:12: error: 'exp' is not a member of 'torch'\n"
              "    3 | // g++: error: unrecognized command-line option, quoted from the source\n")
    assert not flags_rejected(source)  # the source's own error, and a line of it quoted, not the driver's
    assert not flags_rejected("nvcc fatal   : Could not open output file 'cuda.cuda.o'")


def test_a_build_whose_flags_the_compiler_rejects_fails_at_its_first_attempt(tmp_path):
    """No header rung changes the flags, so a flag g++ refuses fails the build once, not once a rung (on a GPU
    each retry also rebuilt the CUDA half beside it: 60-70 s for a demo's "does not compile" sample)."""
    import torch.utils.cpp_extension as cpp

    from oracle.build import BuildFailed, install_build_hooks

    original = cpp.load_inline
    record = BuildRecord()
    try:
        install_build_hooks(tmp_path, None, record)
        with pytest.raises(BuildFailed, match="unrecognized command"):
            cpp.load_inline(name="bad_flag", cpp_sources="torch::Tensor twice(torch::Tensor x) { return x * 2; }",
                            functions=["twice"], extra_cflags=["-O3", "--use_fast_math"])
    finally:
        cpp.load_inline = original
    (folder,) = tmp_path.glob("ext/*")
    choices = json.loads((folder / "choices.json").read_text()) if (folder / "choices.json").exists() else {}
    assert "failed" not in choices  # no second attempt against torch/extension.h
    assert "unrecognized command" in record.error


@pytest.mark.slow
def test_a_cuda_build_whose_flags_nvcc_rejects_fails_at_its_first_attempt(tmp_path, monkeypatch):
    """The same through nvcc itself: a g++ flag in `extra_cuda_cflags` is refused once, not once a rung."""
    import torch.utils.cpp_extension as cpp

    from oracle.build import BuildFailed, install_build_hooks

    _cuda_toolkit(monkeypatch)
    original = cpp.load_inline
    record = BuildRecord()
    try:
        install_build_hooks(tmp_path, "9.0", record)
        with pytest.raises(BuildFailed, match="nvcc fatal"):
            cpp.load_inline(name="bad_cuda_flag", cpp_sources="torch::Tensor run(torch::Tensor x);",
                            cuda_sources=[ELEMENTWISE], functions=["run"], extra_cuda_cflags=["-O3", "-ffast-math"])
    finally:
        cpp.load_inline = original
    (folder,) = tmp_path.glob("ext/*")
    choices = json.loads((folder / "choices.json").read_text()) if (folder / "choices.json").exists() else {}
    assert "failed" not in choices  # neither torch/types.h nor the source as written was tried


def test_a_missing_header_is_requested_not_used(tmp_path):
    record = BuildRecord()
    build_dir = tmp_path / "ext"
    build_dir.mkdir()
    # first rung `types`: a torch whose load_inline keeps its own headers, so main.cpp has torch/extension.h
    choices = _build_choices(build_dir, {"name": "x", "cpp_sources": ["int f();"], "extra_cflags": ["-O3"]}, True,
                             tmp_path / "pch", record, "types")
    assert "pch" not in choices
    assert record.pch_wanted and PchSpec.from_json(record.pch_wanted[0]) == spec_for(["-O3"], None, with_cuda=False)
    # first rung `lite`: main.cpp against the lite binding header, whose own precompiled header is asked for
    record, lite_dir = BuildRecord(), tmp_path / "lite"
    lite_dir.mkdir()
    choices = _build_choices(lite_dir, {"name": "x", "cpp_sources": ["int f();"], "extra_cflags": ["-O3"]}, True,
                             tmp_path / "pch", record, "lite")
    assert choices == {"binding": "lite"}
    wanted = spec_for(["-O3"], None, with_cuda=False, header=LITE_BINDING)
    assert [PchSpec.from_json(w) for w in record.pch_wanted] == [wanted]


def test_the_default_flags_header_is_asked_for_before_any_build(tmp_path):
    """A GPU oracle asks for the header of load_inline's default flags when it starts, so the first builds of a
    cold run find it made; it must be the very header a build without flags of its own looks for."""
    import os
    import signal

    from oracle.build import CandidateBuilds, with_build_flags
    from oracle.device_quiet import QuietDevice

    quiet = QuietDevice("cpu")
    builds = CandidateBuilds(tmp_path / "builds", None, tmp_path / "pch", 60, quiet)
    assert builds.request_default_header(with_cuda=False)
    try:
        record = BuildRecord()
        (tmp_path / "ext").mkdir()
        call = with_build_flags({"name": "x", "cpp_sources": ["int f();"]})  # as the build hook passes it
        _build_choices(tmp_path / "ext", call, True, tmp_path / "pch", record, "types")  # bindings not lite
        wanted = PchSpec.from_json(record.pch_wanted[0])
        assert (tmp_path / "pch" / f"{wanted.key}.log").exists()  # the maker writes its log under the same key
        assert quiet._header_makers  # stopped while a CPU is timed, like any compiler
        assert not builds.request_default_header(with_cuda=False)  # asked for once
    finally:
        for maker in quiet._header_makers:
            os.killpg(maker.pid, signal.SIGKILL)
            maker.wait()
    assert not CandidateBuilds(tmp_path / "b", None, None, 60, quiet).request_default_header(False)  # headers off
    (tmp_path / "file").write_text("")  # a header folder that cannot be made: no header, no error
    assert not CandidateBuilds(tmp_path / "c", None, tmp_path / "file" / "pch", 60, quiet).request_default_header(False)


def _makers_ended(*oracles: Oracle) -> None:
    """The header makers a test started end inside it: one still compiling would slow the next tests."""
    for oracle in oracles:
        for maker in list(oracle.quiet._header_makers):
            maker.wait(600)


@pytest.mark.slow
def test_a_binding_built_against_the_lite_header_asks_for_its_precompiled_header_and_the_next_build_uses_it(tmp_path):
    """The binding (main.cpp) of a C++ kernel compiles against the lite binding header's text and asks for that
    header precompiled; once it is made, the next cold build includes it by name from the header's folder,
    and runs the same."""
    pch = tmp_path / "pch"
    task = load_tasks("builtin", Selection(task_ids=frozenset({"builtin/1_LeakyReLU_Scale"})), 256).tasks[0]
    oracle = Oracle(OracleConfig(device="cpu", cache_dir=tmp_path / "c", pch_dir=pch))
    candidate = oracle.extract(task, LEAKY.read_text())
    build = oracle.build(candidate)
    assert build.ok and build.binding_header == "lite" and not build.pch_used
    (main,) = (tmp_path / "c").rglob("main.cpp")
    assert main.read_text().startswith("// torch/extension.h, cut") and "<torch/extension.h>" not in main.read_text()
    verdict = oracle.check_and_time(task, candidate, build)
    assert verdict.status == "correct", verdict.message
    assert verdict.build_binding_header == "lite"
    assert oracle.build(candidate).binding_header == "lite"  # from the build cache, still on record
    spec = spec_for(["-O3"], None, with_cuda=False, header=LITE_BINDING)
    deadline = time.monotonic() + 600
    while not is_ready(pch, spec) and time.monotonic() < deadline:  # asked for by the build, made beside it
        time.sleep(2)
    assert is_ready(pch, spec), (pch / f"{spec.key}.log").read_text() if (pch / f"{spec.key}.log").exists() else "no log"
    folder = header_folder(pch, spec)
    assert (folder / LITE_BINDING).read_text().startswith("// torch/extension.h, cut")
    assert (folder / f"{LITE_BINDING}.gch").stat().st_size > 1_000_000
    assert not any(pch.glob("*.failed.txt"))

    second = Oracle(OracleConfig(device="cpu", cache_dir=tmp_path / "d", pch_dir=pch, timing=oracle.config.timing))
    candidate = second.extract(task, LEAKY.read_text())
    build = second.build(candidate)
    assert build.ok and build.pch_used and build.binding_header == "lite" and not build.cached
    (main,) = (tmp_path / "d").rglob("main.cpp")
    assert main.read_text().startswith(f"#include <{LITE_BINDING}>")
    library = max((tmp_path / "d").rglob("*.so"), key=lambda p: p.stat().st_mtime)
    stamp = library.stat().st_mtime
    verdict = second.check_and_time(task, candidate, build)
    assert verdict.status == "correct", verdict.message
    assert library.stat().st_mtime == stamp  # the check imported what was built, it did not rebuild
    assert verdict.build_pch and verdict.build_binding_header == "lite"
    _makers_ended(oracle, second)


# torch::exp is not in the lite header: the binding file fails there and is built against torch/extension.h
NEEDS_FULL = LEAKY.read_text().replace("auto y = torch::empty_like(x);", "auto y = torch::exp(x);")


@pytest.mark.slow
def test_header_is_made_in_the_background_and_used_by_the_next_build(tmp_path):
    pch = tmp_path / "pch"
    task = load_tasks("builtin", Selection(task_ids=frozenset({"builtin/1_LeakyReLU_Scale"})), 256).tasks[0]
    source = NEEDS_FULL
    assert source != LEAKY.read_text()

    first = Oracle(OracleConfig(device="cpu", cache_dir=tmp_path / "a", pch_dir=pch))
    built = first.build(first.extract(task, source))
    assert built.ok and not built.pch_used  # no header yet: built the ordinary way, and one was asked for
    assert built.binding_header == "full"  # after the lite binding header failed
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
    assert verdict.build_pch and verdict.build_header is None  # a C++ candidate: no CUDA header rung
    assert verdict.build_binding_header == "full"
    again = second.build(candidate)  # from the build cache: how it was built is still on record
    assert again.cached and again.pch_used
    _makers_ended(first, second)  # the lite binding header, asked for by the first build before it fell back


NVCC = shutil.which("nvcc")
ELEMENTWISE = """#include <torch/extension.h>
__global__ void fill(float* y, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = 1.f; }
torch::Tensor run(torch::Tensor x) {
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "x must be float32");
    auto y = torch::empty_like(x);
    fill<<<(x.numel() + 255) / 256, 256>>>(y.data_ptr<float>(), (int)x.numel());
    return y;
}
"""


def _cuda_toolkit(monkeypatch) -> None:
    """A CPU build of torch leaves CUDA_HOME unset; nvcc's toolkit is where it compiles from. Its link then
    fails (no libtorch_cuda), after both objects were compiled: how far this machine can take a CUDA build."""
    import torch.utils.cpp_extension as cpp

    if NVCC is None:
        pytest.skip("nvcc is not on PATH")
    if cpp.CUDA_HOME is None:
        monkeypatch.setattr(cpp, "CUDA_HOME", str(Path(NVCC).resolve().parent.parent))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")


@pytest.mark.slow
def test_the_lite_rung_compiles_through_load_inline(tmp_path, monkeypatch):
    """Both halves compile at the first rung: the CUDA file against the lite header, main.cpp against the
    lite binding header (no_implicit_headers drops load_inline's own torch/extension.h)."""
    import torch
    import torch.utils.cpp_extension as cpp

    _cuda_toolkit(monkeypatch)
    call = {"name": "lite_rung", "cpp_sources": "torch::Tensor run(torch::Tensor x);", "cuda_sources": [ELEMENTWISE],
            "functions": ["run"], "extra_cflags": ["-O3"], "extra_cuda_cflags": ["-O3"], "build_directory": str(tmp_path),
            "verbose": False}
    try:
        module = cpp.load_inline(**_apply_choices(call, {"header": "lite", "binding": "lite"}))
    except RuntimeError as exc:  # a CPU build of torch: the link has no CUDA libraries to take
        assert not torch.cuda.is_available() and "ld" in str(exc) and "cuda" in str(exc), str(exc)[-2000:]
    else:  # a CUDA build of torch: the extension runs
        x = torch.zeros(1000, device="cuda")
        assert bool((module.run(x) == 1).all())
    assert (tmp_path / "cuda.cuda.o").exists() and (tmp_path / "main.o").exists()
    assert "ATen/core/Tensor.h" in (tmp_path / "cuda.cu").read_text()
    assert "#include <torch/types.h>" not in (tmp_path / "cuda.cu").read_text()
    assert (tmp_path / "main.cpp").read_text().startswith(LITE_BINDING_HEADER + "\n")


@pytest.mark.slow
def test_a_source_the_lite_header_does_not_cover_goes_on_to_torch_types(tmp_path, monkeypatch):
    """torch::exp is not in the lite header: the first rung fails to compile, torch/types.h is next, and the
    folder remembers it (on a CPU build of torch that rung's link fails too, with the linker's message).
    The rung is chosen from load_inline's own signature, not the hook's that replaces it."""
    import torch
    import torch.utils.cpp_extension as cpp

    from oracle.build import BuildFailed, install_build_hooks

    _cuda_toolkit(monkeypatch)
    source = ELEMENTWISE.replace("auto y = torch::empty_like(x);", "auto y = torch::exp(x);")
    original = cpp.load_inline
    record = BuildRecord()
    try:
        install_build_hooks(tmp_path, "9.0", record)
        try:
            cpp.load_inline(name="needs_exp", cpp_sources="torch::Tensor run(torch::Tensor x);", cuda_sources=source,
                            functions=["run"])
        except BuildFailed as exc:
            assert not torch.cuda.is_available() and "cuda" in str(exc), str(exc)
    finally:
        cpp.load_inline = original
    (choices_file,) = tmp_path.glob("ext/*/choices.json")
    choices = json.loads(choices_file.read_text())
    # On a CPU build of torch the torch/types.h rung fails at the link too ("cannot find -ltorch_cuda: No
    # such file"), which reads as a missing declaration: the source as written is tried last.
    assert choices["failed"][0] == "lite" and choices["header"] in ("types", "as written")
    assert record.cuda_header is None or record.cuda_header == "types"


BUILDER = """import json, sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
from oracle.build import BuildRecord, install_build_hooks
import torch, torch.utils.cpp_extension as cpp
record = BuildRecord()
install_build_hooks(Path(sys.argv[1]), None, record, Path(sys.argv[2]))
t0 = time.perf_counter()
m = cpp.load_inline(name="shared_ext", functions=["twice"],  # torch::exp: torch/extension.h, so headers matter
                    cpp_sources="#include <torch/extension.h>\\ntorch::Tensor twice(torch::Tensor x) {{ return torch::exp(x) * 2; }}")
assert torch.allclose(m.twice(torch.zeros(3)), torch.full((3,), 2.0))
print(json.dumps({{"compiled": record.compiled, "pch_used": record.pch_used, "s": time.perf_counter() - t0}}))
"""


@pytest.mark.slow
def test_an_extension_two_candidates_build_at_once_is_not_compiled_again_when_imported(tmp_path):
    """Two candidates sharing an extension, built at once, one before the precompiled header was ready and
    one after: the folder keeps the choices its library was built with, so a later import (a check's
    worker) loads it as it is instead of compiling it again inside a device slot."""
    import subprocess
    import sys

    header = tmp_path / "pch"
    assert make_header(header, spec_for(["-O3"], None, with_cuda=False))
    builder = tmp_path / "builder.py"
    builder.write_text(BUILDER.format(root=str(ROOT)))
    cache = tmp_path / "cache"

    def start(pch: Path) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, str(builder), str(cache), str(pch)], stdout=subprocess.PIPE, text=True)

    first = start(tmp_path / "no-header-yet")
    deadline = time.monotonic() + 120
    while not list(cache.glob("ext/*/choices.json")) and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.1)
    second = start(header)  # starts while the first compiles
    outs = [json.loads(p.communicate(timeout=600)[0].strip().splitlines()[-1]) for p in (first, second)]
    folder = next((cache / "ext").iterdir())
    choices = json.loads((folder / "choices.json").read_text())
    ninja = (folder / "build.ninja").read_text()
    assert outs[0]["compiled"] and not outs[0]["pch_used"]
    assert not outs[1]["compiled"] and not outs[1]["pch_used"]  # it loaded the first one's library
    assert ("pch" in choices) == (str(header) in ninja), (choices, ninja)
    library = next(folder.glob("*.so"))
    stamp = library.stat().st_mtime
    third = start(header)  # a check's worker, importing it later
    out = json.loads(third.communicate(timeout=600)[0].strip().splitlines()[-1])
    assert not out["compiled"] and library.stat().st_mtime == stamp, out
