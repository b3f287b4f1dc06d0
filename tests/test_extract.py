"""Extraction of the candidate module from model completions, backend detection and content hashing.

The completions below are shaped like what 7B-class code models write: prose around a fenced block,
reasoning sections, several drafts, cut-off answers, CUDA shown in its own block, and plain garbage.
"""

from __future__ import annotations

import ast
import dataclasses
import random
import re

import pytest

from oracle.candidate import BACKENDS, Candidate, content_hash
from oracle.extract import (
    REASON_CUT_OFF,
    REASON_EMPTY,
    REASON_NO_CODE,
    REASON_NO_MODELNEW,
    REASON_NOT_TEXT,
    REASON_THINK_ONLY,
    Extraction,
    candidate_from_completion,
    detect_backend,
    extract,
    extract_source,
)
from oracle.verdict import Verdict
from tasks.model import Task

FENCE = "```"

CUDA_MODULE = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_scale_source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void relu_scale_kernel(const float* x, float* out, float scale, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        out[i] = (v > 0.f ? v : 0.f) * scale;
    }
}

torch::Tensor relu_scale_cuda(torch::Tensor x, double scale) {
    auto out = torch::empty_like(x);
    int n = x.numel();
    const int threads = 256;
    const int blocks = (n + threads - 1) / threads;
    relu_scale_kernel<<<blocks, threads>>>(x.data_ptr<float>(), out.data_ptr<float>(), (float)scale, n);
    return out;
}
"""

relu_scale_cpp = "torch::Tensor relu_scale_cuda(torch::Tensor x, double scale);"

relu_scale = load_inline(
    name="relu_scale",
    cpp_sources=relu_scale_cpp,
    cuda_sources=relu_scale_source,
    functions=["relu_scale_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale
        self.relu_scale = relu_scale

    def forward(self, x):
        return self.relu_scale.relu_scale_cuda(x.contiguous(), self.scale)
'''

CPP_MODULE = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

torch::Tensor relu_scale(torch::Tensor x, double scale) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const float* src = xc.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    const int64_t n = xc.numel();
    for (int64_t i = 0; i < n; ++i) {
        dst[i] = (src[i] > 0.f ? src[i] : 0.f) * static_cast<float>(scale);
    }
    return out;
}
"""

ext = load_inline(name="relu_scale_cpu", cpp_sources=[cpp_source], functions=["relu_scale"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return ext.relu_scale(x, self.scale)
'''

TRITON_MODULE = '''import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_scale_kernel(x_ptr, out_ptr, scale, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.maximum(x, 0.0) * scale
    tl.store(out_ptr + offsets, y, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        grid = lambda meta: (triton.cdiv(n, meta["BLOCK_SIZE"]),)
        relu_scale_kernel[grid](x, out, self.scale, n, BLOCK_SIZE=1024)
        return out
'''

TORCH_MODULE = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return torch.clamp_min(x, 0.0).mul_(self.scale)
'''


def fenced(code: str, lang: str = "python") -> str:
    return f"{FENCE}{lang}\n{code}{FENCE}\n"


def markdown_answer(code: str, lang: str = "python") -> str:
    return (
        "To speed this up I fuse the ReLU and the scaling into a single elementwise kernel, so the input is "
        "read once and the output written once.\n\n"
        + fenced(code, lang)
        + "\nThe kernel uses 256 threads per block and a grid that covers all elements. "
        "It should be memory-bound and close to peak bandwidth.\n"
    )


def parses(source: str) -> bool:
    ast.parse(source)
    return True


# ---------------------------------------------------------------- the main shapes of completion


def test_markdown_answer_with_cuda_load_inline():
    result = extract(markdown_answer(CUDA_MODULE))
    assert result == Extraction(CUDA_MODULE, "cuda", result.reason)
    assert "fenced" in result.reason


@pytest.mark.parametrize("lang", ["python", "py", "Python", "python3", ""])
def test_fence_languages(lang):
    assert extract_source(markdown_answer(TORCH_MODULE, lang))[0] == TORCH_MODULE


def test_tilde_fence_and_fence_indented_in_a_list_item():
    tilde = f"Here you go:\n~~~python\n{TORCH_MODULE}~~~\n"
    assert extract_source(tilde)[0] == TORCH_MODULE
    indented = "1. Replace the model:\n\n" + "\n".join(
        ("   " + line if line else line) for line in fenced(TORCH_MODULE).split("\n")
    )
    assert extract_source(indented)[0] == TORCH_MODULE


def test_bare_code():
    result = extract(CUDA_MODULE)
    assert result.source == CUDA_MODULE and result.backend == "cuda"


def test_bare_code_with_chat_noise_around_it():
    text = (
        "Sure! Here's an optimized version of the model with a custom CUDA kernel:\n\n"
        + CUDA_MODULE
        + "\nThis version fuses both operations into one kernel launch.\n"
        "Note: the input must be a contiguous float32 tensor.\n"
        "Done\n"
    )
    source, reason = extract_source(text)
    assert source is not None and parses(source), reason
    assert content_hash(source) == content_hash(CUDA_MODULE)


def test_prefilled_fence_answer_starts_inside_the_block():
    # The prompt ended with "```python\n", so the completion opens mid-block and closes it.
    text = CUDA_MODULE + FENCE + "\n\nThe kernel above fuses ReLU and scaling.\n"
    assert extract_source(text)[0] == CUDA_MODULE


def test_two_versions_take_the_last():
    text = (
        "First, a simple version in PyTorch:\n\n"
        + fenced(TORCH_MODULE)
        + "\nThat still launches two kernels. Here is a fused CUDA version:\n\n"
        + fenced(CUDA_MODULE)
    )
    result = extract(text)
    assert result.source == CUDA_MODULE and result.backend == "cuda"
    assert "last of 2" in result.reason


def test_last_version_broken_falls_back_to_earlier_one():
    broken = CUDA_MODULE.replace("def forward(self, x):", "def forward(self, x)")
    text = "v1:\n" + fenced(TORCH_MODULE) + "\nv2 (faster):\n" + fenced(broken)
    source, reason = extract_source(text)
    assert source == TORCH_MODULE
    assert "later ones have syntax errors" in reason


def test_helper_block_without_modelnew_after_the_module_is_ignored():
    usage = "model = ModelNew(2.0).cuda()\nprint(model(torch.randn(16, 16).cuda()))\n"
    text = fenced(CUDA_MODULE) + "\nUsage:\n" + fenced(usage)
    assert extract_source(text)[0] == CUDA_MODULE


def test_cuda_block_beside_python_is_not_stitched():
    python_part = CUDA_MODULE.replace(
        CUDA_MODULE[CUDA_MODULE.index('relu_scale_source = r"""') : CUDA_MODULE.index("relu_scale_cpp =")],
        'relu_scale_source = open("relu_scale.cu").read()\n\n',
    )
    text = (
        "The CUDA kernel:\n\n"
        + fenced("__global__ void relu_scale_kernel(const float* x, float* out, float s, int n) {}\n", "cuda")
        + "\nThe C++ declaration:\n\n"
        + fenced("torch::Tensor relu_scale_cuda(torch::Tensor x, double scale);\n", "cpp")
        + "\nAnd the Python module:\n\n"
        + fenced(python_part)
    )
    result = extract(text)
    assert result.source == python_part and "__global__ void" not in result.source
    assert result.backend == "cuda"


# ---------------------------------------------------------------- <think> sections


def test_think_section_code_is_ignored_when_code_is_outside():
    draft = TORCH_MODULE.replace("clamp_min", "relu")
    text = f"<think>\nLet me try a draft:\n{fenced(draft)}\nThat is not fused; use CUDA.\n</think>\n\n" + fenced(
        CUDA_MODULE
    )
    assert extract(text).source == CUDA_MODULE


def test_think_section_closed_without_opening_tag():
    # Chat templates often put "<think>" in the prompt: the completion holds only the closing tag.
    text = f"Draft:\n{fenced(CUDA_MODULE)}\n</think>\nFinal answer:\n{fenced(TORCH_MODULE)}"
    assert extract_source(text)[0] == TORCH_MODULE


def test_code_only_inside_think_is_used():
    text = f"<think>\nThe answer:\n{fenced(TRITON_MODULE)}</think>\nI have written the kernel above."
    result = extract(text)
    assert result.source == TRITON_MODULE and result.backend == "triton"
    assert "inside <think>" in result.reason


def test_cut_off_inside_think_without_code():
    text = "<think>\nOkay, the task is a ReLU followed by a scale. I could fuse them, and then"
    assert extract(text) == Extraction(None, None, REASON_THINK_ONLY)


# ---------------------------------------------------------------- cut-off answers


def test_unterminated_final_fence_with_complete_code():
    text = "Here is the kernel:\n\n" + FENCE + "python\n" + CUDA_MODULE
    assert extract(text).source == CUDA_MODULE


def test_unterminated_final_fence_cut_mid_code_falls_back():
    cut = CUDA_MODULE[: CUDA_MODULE.index("(x.contiguous(), self.scale)") + len("(x.contig")]
    text = "Version 1:\n" + fenced(TORCH_MODULE) + "\nVersion 2:\n" + FENCE + "python\n" + cut
    assert extract_source(text)[0] == TORCH_MODULE


def test_unterminated_only_fence_cut_mid_code_reports_cut_off():
    cut = CUDA_MODULE[: CUDA_MODULE.index("super().__init__()") + len("super().__init__(")]
    source, reason = extract_source("Here:\n" + FENCE + "python\n" + cut)
    assert source is None
    assert reason.startswith("the code defining ModelNew has a syntax error at line ")
    assert "cut off" in reason


def test_cut_off_before_modelnew_is_reported_as_cut_off():
    cut = CUDA_MODULE[: CUDA_MODULE.index("functions=")] + 'functions=["relu_sc'
    assert extract_source("Here:\n" + FENCE + "python\n" + cut) == (None, REASON_CUT_OFF)


def test_unterminated_fence_followed_by_explanation():
    # The model forgot to close the fence and went on explaining.
    text = FENCE + "python\n" + CUDA_MODULE + "\nThis launches one thread per element.\nIt should be fast.\n"
    source, reason = extract_source(text)
    assert source is not None and content_hash(source) == content_hash(CUDA_MODULE), reason


def test_unterminated_fence_with_half_written_closing_fence():
    text = FENCE + "python\n" + TORCH_MODULE + "``"
    assert extract_source(text)[0] == TORCH_MODULE


# ---------------------------------------------------------------- backends


def test_cpp_only_load_inline():
    assert extract(markdown_answer(CPP_MODULE)).backend == "cpp"


@pytest.mark.parametrize("empty", ["None", "[]", '""', "['']"])
def test_empty_cuda_sources_is_cpp(empty):
    source = CPP_MODULE.replace("cpp_sources=[cpp_source],", f"cpp_sources=[cpp_source], cuda_sources={empty},")
    assert f"cuda_sources={empty}" in source
    assert detect_backend(source) == "cpp"


def test_triton():
    assert extract(markdown_answer(TRITON_MODULE)).backend == "triton"


def test_triton_jit_imported_by_name():
    source = TRITON_MODULE.replace("import triton\n", "import triton\nfrom triton import jit\n").replace(
        "@triton.jit", "@jit"
    )
    assert detect_backend(source) == "triton"


def test_triton_imported_but_no_jit_kernel_is_torch():
    source = "import triton\n" + TORCH_MODULE
    assert detect_backend(source) == "torch"


def test_plain_torch():
    assert extract(markdown_answer(TORCH_MODULE)).backend == "torch"


def test_positional_cuda_sources():
    source = CUDA_MODULE.replace(
        'name="relu_scale",\n    cpp_sources=relu_scale_cpp,\n    cuda_sources=relu_scale_source,',
        '"relu_scale", relu_scale_cpp, relu_scale_source,',
    )
    assert '"relu_scale", relu_scale_cpp, relu_scale_source,' in source
    assert detect_backend(source) == "cuda"


def test_global_kernel_passed_in_cpp_sources_is_cuda():
    source = CUDA_MODULE.replace(
        "cpp_sources=relu_scale_cpp,\n    cuda_sources=relu_scale_source,", "cpp_sources=relu_scale_source,"
    )
    assert "cuda_sources" not in source
    assert detect_backend(source) == "cuda"


def test_module_alias_and_cpp_extension_load_with_cu_file():
    aliased = CPP_MODULE.replace(
        "from torch.utils.cpp_extension import load_inline", "import torch.utils.cpp_extension as cext"
    ).replace("ext = load_inline(", "ext = cext.load_inline(")
    assert detect_backend(aliased) == "cpp"
    load_cu = (
        "import torch\nimport torch.utils.cpp_extension\n"
        'ext = torch.utils.cpp_extension.load(name="k", sources=["k.cpp", "k.cu"])\n'
    )
    assert detect_backend(load_cu) == "cuda"
    load_cpp = "from torch.utils.cpp_extension import load\next = load('k', ['k.cpp'])\n"
    assert detect_backend(load_cpp) == "cpp"


def test_detect_backend_text_fallback_on_broken_source():
    assert detect_backend(CUDA_MODULE + "\ndef broken(:\n") == "cuda"
    assert detect_backend(CPP_MODULE + "\ndef broken(:\n") == "cpp"
    assert detect_backend(TRITON_MODULE + "\ndef broken(:\n") == "triton"
    assert detect_backend(TORCH_MODULE + "\ndef broken(:\n") == "torch"


def test_explicit_backend_overrides_detection():
    result = extract(markdown_answer(TORCH_MODULE), backend="cuda")
    assert result.source == TORCH_MODULE and result.backend == "cuda"
    assert "as given" in result.reason
    assert extract(markdown_answer(CUDA_MODULE), backend="cuda").backend == "cuda"
    assert extract(markdown_answer(TRITON_MODULE), backend="torch").backend == "torch"


def test_explicit_backend_still_requires_modelnew():
    assert extract("no code here", backend="cuda") == Extraction(None, None, REASON_NO_CODE)
    no_model = fenced(TORCH_MODULE.replace("ModelNew", "FastModel"))
    assert extract(no_model, backend="triton") == Extraction(None, None, REASON_NO_MODELNEW)


def test_unknown_backend_is_a_programming_error():
    with pytest.raises(ValueError):
        extract(TORCH_MODULE, backend="opencl")


# ---------------------------------------------------------------- what counts as defining ModelNew


def test_modelnew_by_assignment():
    source = TORCH_MODULE.replace("class ModelNew(", "class FusedReLUScale(") + "\nModelNew = FusedReLUScale\n"
    assert extract_source(fenced(source))[0] == source


def test_modelnew_not_at_module_level_is_rejected():
    nested = "import torch\n\nif True:\n    class ModelNew(torch.nn.Module):\n        pass\n"
    assert extract_source(fenced(nested)) == (None, REASON_NO_MODELNEW)


# ---------------------------------------------------------------- failures: a reason, never an exception


def test_syntax_error_reason_names_the_line():
    broken = TORCH_MODULE.replace("def forward(self, x):", "def forward(self, x)")
    line = broken.split("\n").index("    def forward(self, x)") + 1
    source, reason = extract_source(markdown_answer(broken))
    assert source is None
    assert re.fullmatch(rf"the code defining ModelNew has a syntax error at line {line}: .+", reason), reason


def test_syntax_error_in_bare_code_is_not_hidden():
    broken = CUDA_MODULE.replace("super().__init__()", "super().__init__(")
    source, reason = extract_source("Here is my solution:\n\n" + broken)
    assert source is None and reason.startswith("the code defining ModelNew has a syntax error at line ")


def test_no_code():
    text = "I'm sorry, but I can't write a faster kernel for this operation; PyTorch's is already optimal."
    assert extract(text) == Extraction(None, None, REASON_NO_CODE)


def test_code_without_modelnew():
    text = markdown_answer(TORCH_MODULE.replace("ModelNew", "Model"))
    assert extract(text) == Extraction(None, None, REASON_NO_MODELNEW)
    only_cuda = "The kernel:\n" + fenced("__global__ void k(float* x) { x[0] = 1.f; }\n", "cuda")
    assert extract(only_cuda) == Extraction(None, None, REASON_NO_MODELNEW)


@pytest.mark.parametrize("text", ["", "   \n\t\n  ", "\n\n"])
def test_empty_and_whitespace(text):
    assert extract(text) == Extraction(None, None, REASON_EMPTY)


def _garbage(seed: int, size: int = 4000) -> bytes:
    rng = random.Random(seed)
    return bytes(rng.randrange(256) for _ in range(size))


@pytest.mark.parametrize("seed", range(5))
def test_garbage_bytes_never_raise(seed):
    blob = _garbage(seed)
    decoded = [blob.decode("latin-1"), blob.decode("utf-8", "replace"), blob.decode("utf-8", "surrogateescape")]
    for text in [blob, *decoded]:
        result = extract(text)
        assert result.source is None and result.backend is None and result.reason


def test_hostile_strings_never_raise():
    samples = [
        TORCH_MODULE.replace("import torch\n", "import torch\x00\n"),  # null byte
        TORCH_MODULE + "\nx = '\ud800'\n",  # lone surrogate
        "class ModelNew:\n    x = " + "(" * 5000 + "\n",  # absurd nesting
        "```python\n```",
        "```",
        "</think>",
        "<think></think>",
        "ModelNew",
        "\x1b[31m" * 200,
    ]
    for text in samples:
        result = extract(text)
        assert isinstance(result, Extraction) and (result.source is None) == (result.backend is None)
        assert result.source is not None or result.reason
    assert extract(None) == Extraction(None, None, REASON_NOT_TEXT)  # type: ignore[arg-type]


def test_bytes_completion_is_decoded():
    assert extract(markdown_answer(TORCH_MODULE).encode()).source == TORCH_MODULE


# ---------------------------------------------------------------- the Candidate record and its hash


def test_hash_is_16_hex_and_stable_under_whitespace():
    digest = content_hash(CUDA_MODULE)
    assert re.fullmatch(r"[0-9a-f]{16}", digest)
    variants = [
        CUDA_MODULE.replace("\n", "\r\n"),
        "\n\n  \n" + CUDA_MODULE + "\n\n\n",
        "\n".join(line + "   " for line in CUDA_MODULE.split("\n")),
        CUDA_MODULE.rstrip("\n"),
    ]
    assert {content_hash(v) for v in variants} == {digest}


def test_hash_changes_under_real_changes():
    changes = [
        CUDA_MODULE.replace("const int threads = 256;", "const int threads = 128;"),
        CUDA_MODULE.replace("        super().__init__()", "    super().__init__()"),  # indentation is code
        CUDA_MODULE.replace("\n\nclass ModelNew", "\nclass ModelNew"),  # inner blank lines are kept
        TORCH_MODULE,
    ]
    hashes = {content_hash(CUDA_MODULE)} | {content_hash(c) for c in changes}
    assert len(hashes) == len(changes) + 1


def test_candidate_make():
    extraction = extract(markdown_answer(CUDA_MODULE))
    candidate = Candidate.make("level1/19_ReLU", extraction.source, extraction.backend)
    assert candidate.hash == content_hash(CUDA_MODULE) and candidate.backend == "cuda"
    assert Candidate.make("level1/19_ReLU", CUDA_MODULE.replace("\n", "\r\n"), "cuda").hash == candidate.hash
    with pytest.raises(dataclasses.FrozenInstanceError):
        candidate.source = ""  # type: ignore[misc]
    with pytest.raises(ValueError):
        Candidate.make("level1/19_ReLU", CUDA_MODULE, "opencl")
    assert BACKENDS == ("cuda", "cpp", "triton", "torch")


def test_one_way_from_a_completion_to_a_candidate_or_a_no_code_verdict():
    task = Task(id="builtin/x", level=1, problem_id=1, name="x", origin="test", code="", sizes={"dim": 8})
    found = candidate_from_completion(task, f"Here you go:\n{FENCE}python\n{CUDA_MODULE}\n{FENCE}\n", device="cuda")
    assert isinstance(found, Candidate) and found.task_id == "builtin/x" and found.backend == "cuda"
    assert found.hash == content_hash(found.source) and found.source.strip() == CUDA_MODULE.strip()
    assert candidate_from_completion(task, CUDA_MODULE, backend="cpp").backend == "cpp"  # the user's word wins
    verdict = candidate_from_completion(task, "Sorry, no code.", device="cuda")
    # a verdict like the oracle's own: its device and the task's sizes, as every verdict has them
    assert isinstance(verdict, Verdict) and verdict.status == "no_code" and verdict.message == REASON_NO_CODE
    assert (verdict.task, verdict.device, verdict.sizes) == ("builtin/x", "cuda", {"dim": 8})
