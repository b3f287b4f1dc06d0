# expected verdict: correct (argmax over any dim into int64, first index on ties and NaN as the largest, as torch.argmax)
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
torch::Tensor argmax_forward(torch::Tensor x, int64_t dim);
"""

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <algorithm>
#include <cstdint>
#include <vector>

// (value, index) is better than (bv, bi) when it is larger, NaN counting as the largest (as torch.argmax),
// and on ties the first index wins.
__device__ __forceinline__ bool better(float v, int64_t i, float bv, int64_t bi) {
    const bool vn = v != v, bn = bv != bv;
    if (vn || bn) return vn && (!bn || i < bi);
    return v > bv || (v == bv && i < bi);
}

__global__ void argmax_rows_kernel(const float* __restrict__ x, int64_t* __restrict__ y, int64_t rows, int64_t R) {
    __shared__ float pv[32];
    __shared__ int64_t pi[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* p = x + row * R;
        float bv = -INFINITY;
        int64_t bi = INT64_MAX;
        for (int64_t r = threadIdx.x; r < R; r += blockDim.x) {
            if (better(p[r], r, bv, bi)) { bv = p[r]; bi = r; }
        }
        for (int off = 16; off > 0; off >>= 1) {
            const float ov = __shfl_down_sync(0xffffffffu, bv, off);
            const int64_t oi = __shfl_down_sync(0xffffffffu, bi, off);
            if (better(ov, oi, bv, bi)) { bv = ov; bi = oi; }
        }
        if (lane == 0) { pv[warp] = bv; pi[warp] = bi; }
        __syncthreads();
        if (warp == 0) {
            bv = lane < warps ? pv[lane] : -INFINITY;
            bi = lane < warps ? pi[lane] : INT64_MAX;
            for (int off = 16; off > 0; off >>= 1) {
                const float ov = __shfl_down_sync(0xffffffffu, bv, off);
                const int64_t oi = __shfl_down_sync(0xffffffffu, bi, off);
                if (better(ov, oi, bv, bi)) { bv = ov; bi = oi; }
            }
            if (lane == 0) y[row] = bi;
        }
        __syncthreads();
    }
}

__global__ void argmax_cols_kernel(const float* __restrict__ x, int64_t* __restrict__ y,
                                   int64_t outer, int64_t R, int64_t inner) {
    const int64_t total = outer * inner;
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const int64_t o = idx / inner, i = idx - o * inner;
        const float* p = x + o * R * inner + i;
        float bv = p[0];
        int64_t bi = 0;
        for (int64_t r = 1; r < R && bv == bv; ++r) {  // the first NaN is final
            const float v = p[r * inner];
            if (v > bv || v != v) { bv = v; bi = r; }
        }
        y[idx] = bi;
    }
}

// x viewed as (outer, R, inner): the reduced dim in the middle.
static void reduce_shape(const torch::Tensor& x, int64_t dim, int64_t& outer, int64_t& R, int64_t& inner,
                         std::vector<int64_t>& out_sizes) {
    outer = 1; inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
    R = x.size(dim);
    for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
    out_sizes = x.sizes().vec();
    out_sizes.erase(out_sizes.begin() + dim);
}

torch::Tensor argmax_forward(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.is_cuda() && x.is_contiguous() && x.scalar_type() == torch::kFloat32,
                "argmax_forward: x must be a contiguous float32 CUDA tensor");
    TORCH_CHECK(x.dim() > 0, "argmax_forward: x must have a dim to reduce");
    if (dim < 0) dim += x.dim();
    TORCH_CHECK(dim >= 0 && dim < x.dim(), "argmax_forward: dim out of range");
    int64_t outer, R, inner;
    std::vector<int64_t> out_sizes;
    reduce_shape(x, dim, outer, R, inner, out_sizes);
    TORCH_CHECK(R > 0, "argmax_forward: cannot reduce an empty dim");
    auto y = torch::empty(out_sizes, x.options().dtype(torch::kLong));
    if (y.numel() == 0) return y;
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const int64_t sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    if (inner == 1) {
        const int64_t blocks = std::min<int64_t>(outer, sms * 64);
        argmax_rows_kernel<<<(unsigned)blocks, 256, 0, stream>>>(x.data_ptr<float>(), y.data_ptr<int64_t>(), outer, R);
    } else {
        const int threads = 256;
        const int64_t blocks = std::min<int64_t>((outer * inner + threads - 1) / threads, sms * 64);
        argmax_cols_kernel<<<(unsigned)blocks, threads, 0, stream>>>(
            x.data_ptr<float>(), y.data_ptr<int64_t>(), outer, R, inner);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

_ext = load_inline(
    name="ks_l1_51_argmax_correct",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["argmax_forward"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super(ModelNew, self).__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.argmax_forward(x.contiguous(), int(self.dim))
