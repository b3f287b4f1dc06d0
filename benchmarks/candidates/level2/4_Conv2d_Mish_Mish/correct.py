# expected verdict: correct (cuDNN conv without bias + one fused kernel: conv bias, Mish, Mish; one block per (n, c) plane, float4)
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
torch::Tensor bias_mish_mish(torch::Tensor y, torch::Tensor conv_bias);
"""

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <algorithm>
#include <cstdint>

// mish(x) = x * tanh(softplus(x)); for x > 20, softplus(x) == x in fp32 and tanh(x) == 1.
__device__ __forceinline__ float mish_f(float x) {
    const float sp = x > 20.0f ? x : log1pf(expf(x));
    return x * tanhf(sp);
}

template <bool VEC>
__global__ void bias_mish_mish_kernel(const float* __restrict__ y, float* __restrict__ out,
                                      const float* __restrict__ conv_bias,
                                      int64_t planes, int64_t C, int64_t HW) {
    for (int64_t plane = blockIdx.x; plane < planes; plane += gridDim.x) {
        const float cb = conv_bias[plane % C];
        const int64_t base = plane * HW;
        if (VEC) {
            const float4* src = reinterpret_cast<const float4*>(y + base);
            float4* dst = reinterpret_cast<float4*>(out + base);
            const int64_t n4 = HW >> 2;
            for (int64_t i = threadIdx.x; i < n4; i += blockDim.x) {
                float4 v = src[i];
                v.x = mish_f(mish_f(v.x + cb));
                v.y = mish_f(mish_f(v.y + cb));
                v.z = mish_f(mish_f(v.z + cb));
                v.w = mish_f(mish_f(v.w + cb));
                dst[i] = v;
            }
        } else {
            for (int64_t i = threadIdx.x; i < HW; i += blockDim.x) out[base + i] = mish_f(mish_f(y[base + i] + cb));
        }
    }
}

torch::Tensor bias_mish_mish(torch::Tensor y, torch::Tensor conv_bias) {
    TORCH_CHECK(y.is_cuda() && conv_bias.is_cuda(), "all tensors must be CUDA tensors");
    TORCH_CHECK(y.is_contiguous() && conv_bias.is_contiguous(), "all tensors must be contiguous");
    TORCH_CHECK(y.scalar_type() == torch::kFloat32 && conv_bias.scalar_type() == torch::kFloat32,
                "all tensors must be float32");
    TORCH_CHECK(y.dim() >= 2, "y must be (N, C, ...)");
    const int64_t C = y.size(1);
    TORCH_CHECK(conv_bias.numel() == C, "conv_bias must have C elements");
    auto out = torch::empty_like(y, torch::MemoryFormat::Contiguous);
    if (y.numel() == 0) return out;
    const int64_t planes = y.size(0) * C;
    const int64_t HW = y.numel() / planes;
    const float* yp = y.data_ptr<float>();
    float* op = out.data_ptr<float>();
    const bool vec = (HW % 4 == 0) &&
        (((reinterpret_cast<uintptr_t>(yp) | reinterpret_cast<uintptr_t>(op)) & 15) == 0);
    const int threads = 256;
    const int64_t blocks = std::min<int64_t>(planes, (int64_t)1 << 30);
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    if (vec) {
        bias_mish_mish_kernel<true><<<(unsigned)blocks, threads, 0, stream>>>(
            yp, op, conv_bias.data_ptr<float>(), planes, C, HW);
    } else {
        bias_mish_mish_kernel<false><<<(unsigned)blocks, threads, 0, stream>>>(
            yp, op, conv_bias.data_ptr<float>(), planes, C, HW);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

_ext = load_inline(
    name="ks_l2_4_conv_mish_mish_correct",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["bias_mish_mish"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super(ModelNew, self).__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)

    def forward(self, x):
        conv = self.conv
        # The convolution stays in cuDNN; its bias is folded into the fused Mish-Mish kernel.
        y = F.conv2d(x, conv.weight, None, conv.stride, conv.padding, conv.dilation, conv.groups)
        cb = conv.bias if conv.bias is not None else torch.zeros(conv.out_channels, device=y.device, dtype=y.dtype)
        return _ext.bias_mish_mish(y.contiguous(), cb.contiguous())
