# expected verdict: correct (CPU-only C++ sum over a dim with keepdim, for testing the pipeline without a GPU)
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <vector>

// x viewed as (outer, R, inner); y[o, 0, i] = sum_r x[o, r, i].
torch::Tensor sum_dim_keepdim(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.device().is_cpu(), "sum_dim_keepdim: x must be a CPU tensor");
    TORCH_CHECK(x.is_contiguous(), "sum_dim_keepdim: x must be contiguous");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "sum_dim_keepdim: x must be float32");
    TORCH_CHECK(x.dim() >= 1, "sum_dim_keepdim: x must have at least one dimension");
    const int64_t nd = x.dim();
    if (dim < 0) dim += nd;
    TORCH_CHECK(dim >= 0 && dim < nd, "sum_dim_keepdim: dim out of range");
    std::vector<int64_t> out_sizes(x.sizes().begin(), x.sizes().end());
    out_sizes[dim] = 1;
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
    for (int64_t d = dim + 1; d < nd; ++d) inner *= x.size(d);
    const int64_t R = x.size(dim);
    auto y = torch::empty(out_sizes, x.options());
    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    at::parallel_for(0, outer, 1, [&](int64_t begin, int64_t end) {
        std::vector<double> acc(inner);
        for (int64_t o = begin; o < end; ++o) {
            std::fill(acc.begin(), acc.end(), 0.0);
            const float* xo = xp + o * R * inner;
            for (int64_t r = 0; r < R; ++r) {
                const float* row = xo + r * inner;
                for (int64_t i = 0; i < inner; ++i) acc[i] += row[i];
            }
            for (int64_t i = 0; i < inner; ++i) yp[o * inner + i] = (float)acc[i];
        }
    });
    return y;
}
"""

_ext = load_inline(
    name="ks_l1_47_sum_cpp",
    cpp_sources=cpp_source,
    functions=["sum_dim_keepdim"],
    verbose=False,
    extra_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super(ModelNew, self).__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.sum_dim_keepdim(x.contiguous(), int(self.dim))
