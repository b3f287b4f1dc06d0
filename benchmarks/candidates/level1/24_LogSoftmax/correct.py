# expected verdict: correct (one block per row: online max and sum of exp merged with warp shuffles, then x - max - log(sum) in one write pass)
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
torch::Tensor log_softmax_rows(torch::Tensor x);
"""

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <algorithm>
#include <cstdint>
#include <cmath>

// Online (max, sum of exp(x - max)) pairs, merged across threads; then out = x - max - log(sum).
struct MS { float m; float s; };

__device__ __forceinline__ MS ms_merge(MS a, MS b) {
    const float m = fmaxf(a.m, b.m);
    if (m == -INFINITY) return {m, 0.0f};
    return {m, (a.m == -INFINITY ? 0.0f : a.s * expf(a.m - m)) + (b.m == -INFINITY ? 0.0f : b.s * expf(b.m - m))};
}

__global__ void log_softmax_rows_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t rows, int64_t D) {
    __shared__ MS partial[32];
    __shared__ float row_shift;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* p = x + row * D;
        float* q = y + row * D;
        MS acc = {-INFINITY, 0.0f};
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
            const float v = p[i];
            if (v > acc.m) {
                acc.s = (acc.m == -INFINITY ? 0.0f : acc.s * expf(acc.m - v)) + 1.0f;
                acc.m = v;
            } else if (v != -INFINITY) {
                acc.s += expf(v - acc.m);
            }
        }
        for (int off = 16; off > 0; off >>= 1) {
            MS o;
            o.m = __shfl_down_sync(0xffffffffu, acc.m, off);
            o.s = __shfl_down_sync(0xffffffffu, acc.s, off);
            acc = ms_merge(acc, o);
        }
        if (lane == 0) partial[warp] = acc;
        __syncthreads();
        if (warp == 0) {
            MS v = lane < warps ? partial[lane] : MS{-INFINITY, 0.0f};
            for (int off = 16; off > 0; off >>= 1) {
                MS o;
                o.m = __shfl_down_sync(0xffffffffu, v.m, off);
                o.s = __shfl_down_sync(0xffffffffu, v.s, off);
                v = ms_merge(v, o);
            }
            if (lane == 0) row_shift = v.m + logf(v.s);
        }
        __syncthreads();
        const float shift = row_shift;
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x) q[i] = p[i] - shift;
        __syncthreads();
    }
}

torch::Tensor log_softmax_rows(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.is_contiguous() && x.scalar_type() == torch::kFloat32,
                "log_softmax_rows: x must be a contiguous float32 CUDA tensor");
    TORCH_CHECK(x.dim() > 0, "log_softmax_rows: x must have at least one dim");
    auto y = torch::empty_like(x, torch::MemoryFormat::Contiguous);
    const int64_t D = x.size(-1);
    if (x.numel() == 0) return y;
    const int64_t rows = x.numel() / D;
    const int64_t sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    const int64_t blocks = std::min<int64_t>(rows, sms * 32);
    const int threads = D >= 8192 ? 1024 : 256;
    log_softmax_rows_kernel<<<(unsigned)blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), rows, D);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

_ext = load_inline(
    name="ks_l1_24_log_softmax_correct",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["log_softmax_rows"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, dim: int = 1):
        super(ModelNew, self).__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dim = self.dim % x.dim()
        if dim == x.dim() - 1:
            return _ext.log_softmax_rows(x.contiguous())
        # Another dim: make it the last one, run the row kernel, and move it back.
        moved = x.movedim(dim, -1).contiguous()
        return _ext.log_softmax_rows(moved).movedim(-1, dim).contiguous()
