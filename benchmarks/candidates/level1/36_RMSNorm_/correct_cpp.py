# expected verdict: correct (CPU-only C++ RMSNorm over dim 1 for testing the pipeline without a GPU)
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <vector>

// x viewed as (B, C, S); y = x / sqrt(mean_c(x^2) + eps), the mean taken over C.
torch::Tensor rmsnorm_forward(torch::Tensor x, double eps) {
    TORCH_CHECK(x.device().is_cpu(), "rmsnorm_forward: x must be a CPU tensor");
    TORCH_CHECK(x.dim() >= 2, "rmsnorm_forward: x must have shape (batch, features, *)");
    TORCH_CHECK(x.is_contiguous(), "rmsnorm_forward: x must be contiguous");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "rmsnorm_forward: x must be float32");
    auto y = torch::empty_like(x, torch::MemoryFormat::Contiguous);
    if (x.numel() == 0) return y;
    const int64_t B = x.size(0), C = x.size(1);
    const int64_t S = x.numel() / (B * C);
    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    const float epsf = (float)eps;
    at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
        std::vector<float> acc(S);
        for (int64_t b = begin; b < end; ++b) {
            const float* xb = xp + b * C * S;
            float* yb = yp + b * C * S;
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (int64_t c = 0; c < C; ++c) {
                const float* row = xb + c * S;
                for (int64_t s = 0; s < S; ++s) acc[s] += row[s] * row[s];
            }
            for (int64_t s = 0; s < S; ++s) acc[s] = std::sqrt(acc[s] / (float)C + epsf);
            for (int64_t c = 0; c < C; ++c) {
                const float* row = xb + c * S;
                float* out = yb + c * S;
                for (int64_t s = 0; s < S; ++s) out[s] = row[s] / acc[s];
            }
        }
    });
    return y;
}
"""

_ext = load_inline(
    name="ks_l1_36_rmsnorm_cpp",
    cpp_sources=cpp_source,
    functions=["rmsnorm_forward"],
    verbose=False,
    extra_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, num_features: int, eps: float = 1e-5):
        super(ModelNew, self).__init__()
        self.num_features = num_features
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.rmsnorm_forward(x.contiguous(), float(self.eps))
