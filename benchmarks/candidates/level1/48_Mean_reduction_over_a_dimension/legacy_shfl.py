# expected verdict: compile_error (legacy_shfl: the warp reduction calls __shfl_down, removed for sm_70+; __shfl_down_sync is required)
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
torch::Tensor mean_forward(torch::Tensor x, int64_t dim);
"""

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <algorithm>
#include <cstdint>
#include <cmath>
#include <vector>

// mean over a dim, accumulated in double and divided by the reduced size
typedef double acc_t;
__device__ __forceinline__ acc_t red_init() { return 0.0; }
__device__ __forceinline__ acc_t red_combine(acc_t a, acc_t b) { return a + b; }
__device__ __forceinline__ float red_finish(acc_t a, int64_t R) { return (float)(a / (double)R); }
// BUG (deliberate): warp_reduce uses the pre-CUDA-9 __shfl_down, which sm_70 and newer do not have.
__device__ __forceinline__ acc_t warp_reduce(acc_t v) {
    #pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = red_combine(v, __shfl_down(v, off));
    return v;
}

// inner == 1 (the last dim is reduced): one block per row, strided loads, warp shuffles, then one warp.
__global__ void mean_rows_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t rows, int64_t R) {
    __shared__ acc_t partial[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* p = x + row * R;
        acc_t acc = red_init();
        for (int64_t r = threadIdx.x; r < R; r += blockDim.x) acc = red_combine(acc, (acc_t)p[r]);
        acc = warp_reduce(acc);
        if (lane == 0) partial[warp] = acc;
        __syncthreads();
        if (warp == 0) {
            acc_t v = lane < warps ? partial[lane] : red_init();
            v = warp_reduce(v);
            if (lane == 0) y[row] = red_finish(v, R);
        }
        __syncthreads();
    }
}

// inner > 1: one thread per (outer, inner) output; a warp reads 32 neighbouring columns (coalesced).
__global__ void mean_cols_kernel(const float* __restrict__ x, float* __restrict__ y,
                                    int64_t outer, int64_t R, int64_t inner) {
    const int64_t total = outer * inner;
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const int64_t o = idx / inner, i = idx - o * inner;
        const float* p = x + o * R * inner + i;
        acc_t acc = red_init();
        for (int64_t r = 0; r < R; ++r) acc = red_combine(acc, (acc_t)p[r * inner]);
        y[idx] = red_finish(acc, R);
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

torch::Tensor mean_forward(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.is_cuda() && x.is_contiguous() && x.scalar_type() == torch::kFloat32,
                "mean_forward: x must be a contiguous float32 CUDA tensor");
    TORCH_CHECK(x.dim() > 0, "mean_forward: x must have a dim to reduce");
    if (dim < 0) dim += x.dim();
    TORCH_CHECK(dim >= 0 && dim < x.dim(), "mean_forward: dim out of range");
    int64_t outer, R, inner;
    std::vector<int64_t> out_sizes;
    reduce_shape(x, dim, outer, R, inner, out_sizes);
    TORCH_CHECK(R > 0, "mean_forward: cannot reduce an empty dim");
    auto y = torch::empty(out_sizes, x.options());
    if (y.numel() == 0) return y;
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const int64_t sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    if (inner == 1) {
        const int64_t blocks = std::min<int64_t>(outer, sms * 64);
        mean_rows_kernel<<<(unsigned)blocks, 256, 0, stream>>>(x.data_ptr<float>(), y.data_ptr<float>(), outer, R);
    } else {
        const int threads = 256;
        const int64_t blocks = std::min<int64_t>((outer * inner + threads - 1) / threads, sms * 64);
        mean_cols_kernel<<<(unsigned)blocks, threads, 0, stream>>>(
            x.data_ptr<float>(), y.data_ptr<float>(), outer, R, inner);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

_ext = load_inline(
    name="ks_l1_48_mean_legacy_shfl",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["mean_forward"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super(ModelNew, self).__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.mean_forward(x.contiguous(), int(self.dim))
