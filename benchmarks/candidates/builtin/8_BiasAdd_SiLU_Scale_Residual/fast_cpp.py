import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>

// out = residual + scale * silu(x + bias[c]) over NCHW in one pass: x and residual are read once and
// out written once, where eager PyTorch makes four passes. One (batch, channel) plane per step.
torch::Tensor bias_silu_scale_residual(torch::Tensor x, torch::Tensor bias, torch::Tensor residual, double scale) {
    TORCH_CHECK(x.device().is_cpu() && residual.device().is_cpu() && bias.device().is_cpu(), "CPU tensors only");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && residual.scalar_type() == torch::kFloat32 &&
                bias.scalar_type() == torch::kFloat32, "float32 tensors only");
    TORCH_CHECK(x.dim() == 4 && x.sizes() == residual.sizes(), "x and residual must be NCHW of one shape");
    TORCH_CHECK(x.is_contiguous() && residual.is_contiguous() && bias.is_contiguous(), "contiguous tensors only");
    const int64_t channels = x.size(1);
    TORCH_CHECK(bias.numel() == channels, "one bias a channel");
    const int64_t plane = x.size(2) * x.size(3);
    auto out = torch::empty_like(x);
    const float* xp = x.data_ptr<float>();
    const float* rp = residual.data_ptr<float>();
    const float* bp = bias.data_ptr<float>();
    float* op = out.data_ptr<float>();
    const float s = static_cast<float>(scale);
    at::parallel_for(0, x.size(0) * channels, 1, [&](int64_t begin, int64_t end) {
        for (int64_t p = begin; p < end; ++p) {
            const float b = bp[p % channels];
            const int64_t base = p * plane;
            for (int64_t i = 0; i < plane; ++i) {
                const float v = xp[base + i] + b;
                op[base + i] = rp[base + i] + s * (v / (1.0f + std::exp(-v)));
            }
        }
    });
    return out;
}
"""

fused_ext = load_inline(
    name="bias_silu_scale_residual",
    cpp_sources=cpp_source,
    functions=["bias_silu_scale_residual"],
    extra_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, channels: int, scale: float):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(1, channels, 1, 1) * 0.5)
        self.scale = scale

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return fused_ext.bias_silu_scale_residual(x.contiguous(), self.bias.contiguous(), residual.contiguous(), self.scale)
