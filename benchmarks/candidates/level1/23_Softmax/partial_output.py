# expected verdict: incorrect (partial_output: only the first half of the rows is written; the rest stays torch::empty garbage)
# NOTE: caught only where 1/dim > ~1e-4: at the task's own dim=393216 every softmax value is ~2.5e-6 < atol, so even
# an all-zero output passes allclose(atol=1e-4); the evaluator's smaller second size (or a relative check) catches it.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
torch::Tensor softmax_rows(torch::Tensor x);
"""

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <algorithm>
#include <cstdint>
#include <cmath>

// (m, s) represents sum_j exp(x_j - m). Merging two partial states.
__device__ __forceinline__ void ms_merge(float& m, float& s, float m2, float s2) {
    const float mn = fmaxf(m, m2);
    if (mn == -INFINITY) { m = mn; s = 0.0f; return; }
    s = s * expf(m - mn) + s2 * expf(m2 - mn);
    m = mn;
}

__device__ __forceinline__ void ms_add(float& m, float& s, float v) {
    if (v > m) { s = s * expf(m - v) + 1.0f; m = v; }
    else if (v > -INFINITY) { s += expf(v - m); }
}

// Block-wide reduction of (m, s); blockDim.x must be a multiple of 32 (<= 1024).
__device__ __forceinline__ void block_reduce_ms(float& m, float& s) {
    __shared__ float sh_m[32];
    __shared__ float sh_s[32];
    #pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, off);
        const float s2 = __shfl_xor_sync(0xffffffffu, s, off);
        ms_merge(m, s, m2, s2);
    }
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;
    if (lane == 0) { sh_m[warp] = m; sh_s[warp] = s; }
    __syncthreads();
    if (warp == 0) {
        m = lane < nwarps ? sh_m[lane] : -INFINITY;
        s = lane < nwarps ? sh_s[lane] : 0.0f;
        #pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            const float m2 = __shfl_xor_sync(0xffffffffu, m, off);
            const float s2 = __shfl_xor_sync(0xffffffffu, s, off);
            ms_merge(m, s, m2, s2);
        }
        if (lane == 0) { sh_m[0] = m; sh_s[0] = s; }
    }
    __syncthreads();
    m = sh_m[0];
    s = sh_s[0];
    __syncthreads();  // the shared slots are reused by the next row
}

template <bool VEC>
__global__ void softmax_rows_kernel(const float* __restrict__ x, float* __restrict__ y,
                                    int64_t rows, int64_t cols) {
    // BUG (deliberate): only rows [0, rows/2) are processed.
    const int64_t half_rows = rows / 2;
    for (int64_t row = blockIdx.x; row < half_rows; row += gridDim.x) {
        const float* xr = x + row * cols;
        float* yr = y + row * cols;
        float m = -INFINITY, s = 0.0f;
        if (VEC) {
            const float4* xr4 = reinterpret_cast<const float4*>(xr);
            const int64_t c4 = cols >> 2;
            for (int64_t i = threadIdx.x; i < c4; i += blockDim.x) {
                const float4 v = xr4[i];
                ms_add(m, s, v.x); ms_add(m, s, v.y); ms_add(m, s, v.z); ms_add(m, s, v.w);
            }
        } else {
            for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) ms_add(m, s, xr[i]);
        }
        block_reduce_ms(m, s);
        const float inv = 1.0f / s;
        if (VEC) {
            const float4* xr4 = reinterpret_cast<const float4*>(xr);
            float4* yr4 = reinterpret_cast<float4*>(yr);
            const int64_t c4 = cols >> 2;
            for (int64_t i = threadIdx.x; i < c4; i += blockDim.x) {
                float4 v = xr4[i];
                v.x = expf(v.x - m) * inv;
                v.y = expf(v.y - m) * inv;
                v.z = expf(v.z - m) * inv;
                v.w = expf(v.w - m) * inv;
                yr4[i] = v;
            }
        } else {
            for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) yr[i] = expf(xr[i] - m) * inv;
        }
    }
}

// Softmax over dim 1 of a 2-D (rows, cols) tensor.
torch::Tensor softmax_rows(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "softmax_rows: x must be a CUDA tensor");
    TORCH_CHECK(x.dim() == 2, "softmax_rows: x must be 2-D (batch, features)");
    TORCH_CHECK(x.is_contiguous(), "softmax_rows: x must be contiguous");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "softmax_rows: x must be float32");
    auto y = torch::empty_like(x, torch::MemoryFormat::Contiguous);
    const int64_t rows = x.size(0), cols = x.size(1);
    if (rows == 0 || cols == 0) return y;

    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    const bool vec = (cols % 4 == 0) &&
        (((reinterpret_cast<uintptr_t>(xp) | reinterpret_cast<uintptr_t>(yp)) & 15) == 0);
    const int64_t work = vec ? cols / 4 : cols;
    int64_t threads = ((work + 31) / 32) * 32;
    threads = std::max<int64_t>(32, std::min<int64_t>(1024, threads));
    const int64_t blocks = std::min<int64_t>(rows, (int64_t)1 << 30);
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    if (vec) {
        softmax_rows_kernel<true><<<(unsigned)blocks, (unsigned)threads, 0, stream>>>(xp, yp, rows, cols);
    } else {
        softmax_rows_kernel<false><<<(unsigned)blocks, (unsigned)threads, 0, stream>>>(xp, yp, rows, cols);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

_ext = load_inline(
    name="ks_l1_23_softmax_partial_output",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["softmax_rows"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.softmax_rows(x.contiguous())
