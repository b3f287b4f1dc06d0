# expected verdict: correct (CPU-only C++ row softmax for testing the pipeline without a GPU)
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <limits>

// Softmax over dim 1 of a 2-D (rows, cols) tensor.
torch::Tensor softmax_rows(torch::Tensor x) {
    TORCH_CHECK(x.device().is_cpu(), "softmax_rows: x must be a CPU tensor");
    TORCH_CHECK(x.dim() == 2, "softmax_rows: x must be 2-D (batch, features)");
    TORCH_CHECK(x.is_contiguous(), "softmax_rows: x must be contiguous");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "softmax_rows: x must be float32");
    auto y = torch::empty_like(x, torch::MemoryFormat::Contiguous);
    const int64_t rows = x.size(0), cols = x.size(1);
    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
            const float* xr = xp + r * cols;
            float* yr = yp + r * cols;
            float m = -std::numeric_limits<float>::infinity();
            for (int64_t j = 0; j < cols; ++j) m = xr[j] > m ? xr[j] : m;
            double s = 0.0;
            for (int64_t j = 0; j < cols; ++j) {
                const float e = std::exp(xr[j] - m);
                yr[j] = e;
                s += e;
            }
            const float inv = (float)(1.0 / s);
            for (int64_t j = 0; j < cols; ++j) yr[j] *= inv;
        }
    });
    return y;
}
"""

_ext = load_inline(
    name="ks_l1_23_softmax_cpp",
    cpp_sources=cpp_source,
    functions=["softmax_rows"],
    verbose=False,
    extra_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.softmax_rows(x.contiguous())
