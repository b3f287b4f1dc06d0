# expected verdict: correct (CPU-only C++ ReLU for testing the pipeline without a GPU)
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>

torch::Tensor relu_forward(torch::Tensor x) {
    TORCH_CHECK(x.device().is_cpu(), "relu_forward: x must be a CPU tensor");
    TORCH_CHECK(x.is_contiguous(), "relu_forward: x must be contiguous");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "relu_forward: x must be float32");
    auto y = torch::empty_like(x, torch::MemoryFormat::Contiguous);
    const int64_t n = x.numel();
    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    at::parallel_for(0, n, 32768, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
            const float v = xp[i];
            yp[i] = v < 0.0f ? 0.0f : v;  // NaN passes through, as in torch.relu
        }
    });
    return y;
}
"""

_ext = load_inline(
    name="ks_l1_19_relu_cpp",
    cpp_sources=cpp_source,
    functions=["relu_forward"],
    verbose=False,
    extra_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.relu_forward(x.contiguous())
