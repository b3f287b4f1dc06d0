# expected verdict: incorrect (truncated_constants: SELU's alpha and scale cut to 1.67 and 1.05; relative error ~7e-4 on positive inputs, above the fp32 tolerance 1e-4)
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
torch::Tensor selu_forward(torch::Tensor x, double p);
"""

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <algorithm>
#include <cstdint>

// selu with constants cut to three digits (a common slip)
__device__ __forceinline__ float op_f(float v, float p) {
    const float alpha = 1.67f;   // BUG (deliberate): 1.6732632...
    const float scale = 1.05f;   // BUG (deliberate): 1.0507009...
    return v > 0.0f ? scale * v : scale * alpha * expm1f(v);
}

// Each block owns a tile of UNROLL * blockDim.x float4s; all loads are issued before any store.
constexpr int UNROLL = 4;
__global__ void selu_vec4_kernel(const float4* __restrict__ x, float4* __restrict__ y, int64_t n4, float p) {
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

__global__ void selu_scalar_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t start, int64_t n, float p) {
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t i = start + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        y[i] = op_f(x[i], p);
    }
}

torch::Tensor selu_forward(torch::Tensor x, double p) {
    TORCH_CHECK(x.is_cuda(), "selu_forward: x must be a CUDA tensor");
    TORCH_CHECK(x.is_contiguous(), "selu_forward: x must be contiguous");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "selu_forward: x must be float32");
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
        selu_vec4_kernel<<<(unsigned)blocks, threads, 0, stream>>>(
            reinterpret_cast<const float4*>(xp), reinterpret_cast<float4*>(yp), n4, (float)p);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    const int64_t start = n4 * 4;
    if (start < n) {
        const int64_t blocks = std::min((n - start + threads - 1) / threads, max_blocks);
        selu_scalar_kernel<<<(unsigned)blocks, threads, 0, stream>>>(xp, yp, start, n, (float)p);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    return y;
}
"""

_ext = load_inline(
    name="ks_l1_27_selu_truncated_constants",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["selu_forward"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.selu_forward(x.contiguous(), 0.0)

