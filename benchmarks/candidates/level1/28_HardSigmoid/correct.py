# expected verdict: correct (vectorised HardSigmoid clamp(x + 3, 0, 6) / 6, NaN kept)
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
torch::Tensor hardsigmoid_forward(torch::Tensor x, double p);
"""

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <algorithm>
#include <cstdint>

// hardsigmoid(x) = min(max(x + 3, 0), 6) / 6, written with comparisons so that NaN stays NaN as in PyTorch
__device__ __forceinline__ float op_f(float v, float p) {
    float t = v + 3.0f;
    t = t < 0.0f ? 0.0f : t;
    t = t > 6.0f ? 6.0f : t;
    return t / 6.0f;
}

// Each block owns a tile of UNROLL * blockDim.x float4s; all loads are issued before any store.
constexpr int UNROLL = 4;
__global__ void hardsigmoid_vec4_kernel(const float4* __restrict__ x, float4* __restrict__ y, int64_t n4, float p) {
    const int64_t tile = (int64_t)blockDim.x * UNROLL;
    for (int64_t base = (int64_t)blockIdx.x * tile + threadIdx.x; base < n4; base += (int64_t)gridDim.x * tile) {
        float4 v[UNROLL];
        #pragma unroll
        for (int k = 0; k < UNROLL; ++k) {
            const int64_t i = base + (int64_t)k * blockDim.x;
            if (i < n4) v[k] = x[i];
        }
        #pragma unroll
        for (int k = 0; k < UNROLL; ++k) {
            const int64_t i = base + (int64_t)k * blockDim.x;
            if (i < n4) {
                v[k].x = op_f(v[k].x, p);
                v[k].y = op_f(v[k].y, p);
                v[k].z = op_f(v[k].z, p);
                v[k].w = op_f(v[k].w, p);
                y[i] = v[k];
            }
        }
    }
}

__global__ void hardsigmoid_scalar_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t start, int64_t n, float p) {
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t i = start + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        y[i] = op_f(x[i], p);
    }
}

torch::Tensor hardsigmoid_forward(torch::Tensor x, double p) {
    TORCH_CHECK(x.is_cuda(), "hardsigmoid_forward: x must be a CUDA tensor");
    TORCH_CHECK(x.is_contiguous(), "hardsigmoid_forward: x must be contiguous");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "hardsigmoid_forward: x must be float32");
    auto y = torch::empty_like(x, torch::MemoryFormat::Contiguous);
    const int64_t n = x.numel();
    if (n == 0) return y;
    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const int threads = 256;
    const int64_t max_blocks = (int64_t)at::cuda::getCurrentDeviceProperties()->multiProcessorCount * 32;
    const bool aligned = ((reinterpret_cast<uintptr_t>(xp) | reinterpret_cast<uintptr_t>(yp)) & 15) == 0;
    const int64_t n4 = aligned ? n / 4 : 0;
    if (n4 > 0) {
        const int64_t blocks = std::min<int64_t>((n4 + threads * UNROLL - 1) / (threads * UNROLL), INT32_MAX);
        hardsigmoid_vec4_kernel<<<(unsigned)blocks, threads, 0, stream>>>(
            reinterpret_cast<const float4*>(xp), reinterpret_cast<float4*>(yp), n4, (float)p);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    const int64_t start = n4 * 4;
    if (start < n) {
        const int64_t blocks = std::min((n - start + threads - 1) / threads, max_blocks);
        hardsigmoid_scalar_kernel<<<(unsigned)blocks, threads, 0, stream>>>(xp, yp, start, n, (float)p);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    return y;
}
"""

_ext = load_inline(
    name="ks_l1_28_hardsigmoid_correct",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["hardsigmoid_forward"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.hardsigmoid_forward(x.contiguous(), 0.0)

