# expected verdict: runtime_error (bad launch configuration: 2048 threads per block -> cudaErrorInvalidConfiguration at launch)
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
torch::Tensor sum_dim_keepdim(torch::Tensor x, int64_t dim);
"""

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <algorithm>
#include <cstdint>
#include <vector>

__device__ __forceinline__ float warp_sum(float v) {
    #pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

// inner == 1: each row of length R is contiguous; one block per row, blockDim multiple of 32.
__global__ void sum_contig_rows_kernel(const float* __restrict__ x, float* __restrict__ y,
                                       int64_t rows, int64_t R) {
    __shared__ float partial[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* xr = x + row * R;
        float acc = 0.0f;
        for (int64_t i = threadIdx.x; i < R; i += blockDim.x) acc += xr[i];
        acc = warp_sum(acc);
        if (lane == 0) partial[warp] = acc;
        __syncthreads();
        if (warp == 0) {
            acc = lane < nwarps ? partial[lane] : 0.0f;
            acc = warp_sum(acc);
            if (lane == 0) y[row] = acc;
        }
        __syncthreads();
    }
}

// inner > 1: x viewed as (outer, R, inner); output column col = o * inner + i.
// Block (32, TY): threadIdx.x walks adjacent columns (coalesced), threadIdx.y splits R.
constexpr int TY = 8;
__global__ void sum_strided_kernel(const float* __restrict__ x, float* __restrict__ y,
                                   int64_t outer, int64_t R, int64_t inner) {
    __shared__ float partial[TY][33];
    const int64_t total = outer * inner;
    const int64_t col = (int64_t)blockIdx.x * 32 + threadIdx.x;
    float acc = 0.0f;
    if (col < total) {
        const int64_t o = col / inner;
        const int64_t i = col - o * inner;
        const float* p = x + o * R * inner + i;
        for (int64_t r = threadIdx.y; r < R; r += TY) acc += p[r * inner];
    }
    partial[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && col < total) {
        float s = 0.0f;
        #pragma unroll
        for (int k = 0; k < TY; ++k) s += partial[k][threadIdx.x];
        y[col] = s;
    }
}

torch::Tensor sum_dim_keepdim(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.is_cuda(), "sum_dim_keepdim: x must be a CUDA tensor");
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
    if (y.numel() == 0) return y;
    if (R == 0) { y.zero_(); return y; }

    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    if (inner == 1) {
        // BUG (deliberate): 2048 threads per block exceeds the 1024 limit.
        int64_t threads = 2048;
        const int64_t blocks = std::min<int64_t>(outer, (int64_t)1 << 30);
        sum_contig_rows_kernel<<<(unsigned)blocks, (unsigned)threads, 0, stream>>>(xp, yp, outer, R);
    } else {
        const int64_t blocks = (outer * inner + 31) / 32;
        TORCH_CHECK(blocks < ((int64_t)1 << 31), "sum_dim_keepdim: too many output columns");
        // BUG (deliberate): 32 x 64 = 2048 threads per block exceeds the 1024 limit.
        dim3 block(32, TY * 8);
        sum_strided_kernel<<<(unsigned)blocks, block, 0, stream>>>(xp, yp, outer, R, inner);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

_ext = load_inline(
    name="ks_l1_47_sum_runtime_error",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["sum_dim_keepdim"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super(ModelNew, self).__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.sum_dim_keepdim(x.contiguous(), int(self.dim))
