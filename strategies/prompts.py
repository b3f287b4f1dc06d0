"""Prompt text shared by the strategies: the rules of each backend and one worked example we wrote."""

from __future__ import annotations

SYSTEM = (
    "You are an expert GPU kernel engineer. You replace PyTorch operators with custom kernels that are "
    "correct first and fast second. Answer with one complete Python module in a single ```python block."
)

RULES = {
    "cuda": """Write a Python module that defines `class ModelNew(nn.Module)`:
- same `__init__` arguments and the same parameters/submodules (same names, same order) as `Model`, and the
  same `forward` inputs and output;
- custom CUDA kernels compiled with `torch.utils.cpp_extension.load_inline(name=..., cpp_sources=..., cuda_sources=..., functions=[...])`;
  `forward` must call them; kernels must work for any size (bounds checks), read contiguous float32 inputs,
  and write a freshly allocated output (never modify the inputs);
- library GEMM or convolution (cuBLAS/cuDNN through PyTorch) may stay; replace the rest, and fuse the
  elementwise work around them into one kernel where you can.""",
    "cpp": """Write a Python module that defines `class ModelNew(nn.Module)`:
- same `__init__` arguments and the same parameters/submodules (same names, same order) as `Model`, and the
  same `forward` inputs and output;
- custom C++ CPU code compiled with `torch.utils.cpp_extension.load_inline(name=..., cpp_sources=..., functions=[...])`
  (no CUDA); `forward` must call it; loop over `data_ptr<float>()` and write a freshly allocated output
  (never modify the inputs).""",
    "triton": """Write a Python module that defines `class ModelNew(nn.Module)`:
- same `__init__` arguments and the same parameters/submodules (same names, same order) as `Model`, and the
  same `forward` inputs and output;
- custom kernels written with `@triton.jit` and launched from `forward`; mask every load and store so any
  size works, and write a freshly allocated output (never modify the inputs).""",
}

EXAMPLE_TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, alpha: float):
        super().__init__()
        self.alpha = alpha

    def forward(self, a, b):
        return a * self.alpha + b


size = 1 << 20


def get_inputs():
    return [torch.randn(size), torch.randn(size)]


def get_init_inputs():
    return [0.5]
'''

EXAMPLES = {
    "cuda": '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void axpy_kernel(const float* a, const float* b, float* out, float alpha, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] * alpha + b[i];
}

torch::Tensor axpy(torch::Tensor a, torch::Tensor b, double alpha) {
    TORCH_CHECK(a.is_cuda() && a.is_contiguous() && b.is_contiguous(), "contiguous CUDA tensors expected");
    auto out = torch::empty_like(a);
    int64_t n = a.numel();
    int threads = 256;
    int blocks = (int)((n + threads - 1) / threads);
    axpy_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), (float)alpha, n);
    return out;
}
"""
cpp_source = "torch::Tensor axpy(torch::Tensor a, torch::Tensor b, double alpha);"

axpy_ext = load_inline(name="axpy_ext", cpp_sources=cpp_source, cuda_sources=cuda_source, functions=["axpy"])


class ModelNew(nn.Module):
    def __init__(self, alpha: float):
        super().__init__()
        self.alpha = alpha

    def forward(self, a, b):
        return axpy_ext.axpy(a.contiguous(), b.contiguous(), self.alpha)
''',
    "cpp": '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

torch::Tensor axpy(torch::Tensor a, torch::Tensor b, double alpha) {
    TORCH_CHECK(a.is_contiguous() && b.is_contiguous(), "contiguous tensors expected");
    auto out = torch::empty_like(a);
    const float* pa = a.data_ptr<float>();
    const float* pb = b.data_ptr<float>();
    float* po = out.data_ptr<float>();
    const float k = (float)alpha;
    for (int64_t i = 0; i < a.numel(); ++i) po[i] = pa[i] * k + pb[i];
    return out;
}
"""

axpy_ext = load_inline(name="axpy_cpu", cpp_sources=cpp_source, functions=["axpy"])


class ModelNew(nn.Module):
    def __init__(self, alpha: float):
        super().__init__()
        self.alpha = alpha

    def forward(self, a, b):
        return axpy_ext.axpy(a.contiguous(), b.contiguous(), self.alpha)
''',
    "triton": '''import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def axpy_kernel(a_ptr, b_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask)
    b = tl.load(b_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, a * alpha + b, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, alpha: float):
        super().__init__()
        self.alpha = alpha

    def forward(self, a, b):
        a, b = a.contiguous(), b.contiguous()
        out = torch.empty_like(a)
        n = a.numel()
        axpy_kernel[(triton.cdiv(n, 1024),)](a, b, out, self.alpha, n, BLOCK=1024)
        return out
''',
}


def task_block(code: str) -> str:
    return f"```python\n{code.strip()}\n```"


def example_block(backend: str) -> str:
    return (f"Example. For this task:\n{task_block(EXAMPLE_TASK)}\nan answer is:\n"
            f"{task_block(EXAMPLES[backend])}")
