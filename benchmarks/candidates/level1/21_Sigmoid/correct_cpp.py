# expected verdict: correct (CPU-only C++ sigmoid for testing the pipeline without a GPU)
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>

torch::Tensor sigmoid_forward(torch::Tensor x) {
    TORCH_CHECK(x.device().is_cpu(), "sigmoid_forward: x must be a CPU tensor");
    TORCH_CHECK(x.is_contiguous(), "sigmoid_forward: x must be contiguous");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "sigmoid_forward: x must be float32");
    auto y = torch::empty_like(x, torch::MemoryFormat::Contiguous);
    const int64_t n = x.numel();
    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    at::parallel_for(0, n, 16384, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
            yp[i] = 1.0f / (1.0f + std::exp(-xp[i]));
        }
    });
    return y;
}
"""

_ext = load_inline(
    name="ks_l1_21_sigmoid_cpp",
    cpp_sources=cpp_source,
    functions=["sigmoid_forward"],
    verbose=False,
    extra_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.sigmoid_forward(x.contiguous())
