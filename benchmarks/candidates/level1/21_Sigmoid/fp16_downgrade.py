# expected verdict: incorrect (fp16_downgrade: sigmoid computed in __half, error ~2e-4 > fp32 tolerance 1e-4)
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
torch::Tensor sigmoid_forward(torch::Tensor x);
"""

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_fp16.h>
#include <algorithm>
#include <cstdint>

// Deliberately lossy: the input is rounded to half and the whole formula runs in half
// (PyTorch builds with __CUDA_NO_HALF_OPERATORS__, hence the intrinsics).
__device__ __forceinline__ float sigmoid_half(float v) {
    const __half h = __float2half_rn(v);
    const __half one = __float2half_rn(1.0f);
    const __half r = __hdiv(one, __hadd(one, hexp(__hneg(h))));
    return __half2float(r);
}

__global__ void sigmoid_half_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        y[i] = sigmoid_half(x[i]);
    }
}

torch::Tensor sigmoid_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "sigmoid_forward: x must be a CUDA tensor");
    TORCH_CHECK(x.is_contiguous(), "sigmoid_forward: x must be contiguous");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "sigmoid_forward: x must be float32");
    auto y = torch::empty_like(x, torch::MemoryFormat::Contiguous);
    const int64_t n = x.numel();
    if (n == 0) return y;
    const int threads = 256;
    const int64_t max_blocks = (int64_t)at::cuda::getCurrentDeviceProperties()->multiProcessorCount * 32;
    const int64_t blocks = std::min((n + threads - 1) / threads, max_blocks);
    sigmoid_half_kernel<<<(unsigned)blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

_ext = load_inline(
    name="ks_l1_21_sigmoid_fp16_downgrade",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["sigmoid_forward"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.sigmoid_forward(x.contiguous())
