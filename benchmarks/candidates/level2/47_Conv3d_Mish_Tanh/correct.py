# expected verdict: correct (cuDNN 3D conv without bias + one fused kernel: conv bias, Mish, tanh; one block per (n, c) volume, float4)
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
torch::Tensor conv3d_mish_tanh(torch::Tensor y, torch::Tensor conv_bias, double p0);
"""

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <algorithm>
#include <cstdint>

__device__ __forceinline__ float gelu_f(float v) { return 0.5f * v * (1.0f + erff(v * 0.70710678118654752440f)); }
__device__ __forceinline__ float mish_f(float v) { return v * tanhf(v > 20.0f ? v : log1pf(expf(v))); }

// tanh(mish(v + conv_bias)); p0 unused
__device__ __forceinline__ float epilogue(float v, float cb, float p0) {
    (void)p0;
    return tanhf(mish_f(v + cb));
}

// y is (N, C, spatial...) contiguous; one block per (n, c) plane, so the channel's bias is read once.
template <bool VEC>
__global__ void conv3d_mish_tanh_kernel(const float* __restrict__ y, float* __restrict__ out, const float* __restrict__ conv_bias,
                               float p0, int64_t planes, int64_t C, int64_t HW) {
    for (int64_t plane = blockIdx.x; plane < planes; plane += gridDim.x) {
        const float cb = conv_bias[plane % C];
        const int64_t base = plane * HW;
        if (VEC) {
            const float4* src = reinterpret_cast<const float4*>(y + base);
            float4* dst = reinterpret_cast<float4*>(out + base);
            for (int64_t i = threadIdx.x; i < (HW >> 2); i += blockDim.x) {
                float4 v = src[i];
                v.x = epilogue(v.x, cb, p0);
                v.y = epilogue(v.y, cb, p0);
                v.z = epilogue(v.z, cb, p0);
                v.w = epilogue(v.w, cb, p0);
                dst[i] = v;
            }
        } else {
            for (int64_t i = threadIdx.x; i < HW; i += blockDim.x) out[base + i] = epilogue(y[base + i], cb, p0);
        }
    }
}

torch::Tensor conv3d_mish_tanh(torch::Tensor y, torch::Tensor conv_bias, double p0) {
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
    const bool vec = (HW % 4 == 0) && (((reinterpret_cast<uintptr_t>(yp) | reinterpret_cast<uintptr_t>(op)) & 15) == 0);
    const int threads = 256;
    const int64_t blocks = std::min<int64_t>(planes, (int64_t)1 << 30);
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    if (vec) {
        conv3d_mish_tanh_kernel<true><<<(unsigned)blocks, threads, 0, stream>>>(yp, op, conv_bias.data_ptr<float>(), (float)p0, planes, C, HW);
    } else {
        conv3d_mish_tanh_kernel<false><<<(unsigned)blocks, threads, 0, stream>>>(yp, op, conv_bias.data_ptr<float>(), (float)p0, planes, C, HW);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

_ext = load_inline(
    name="ks_l2_47_conv3d_mish_tanh_correct",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["conv3d_mish_tanh"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0):
        super(ModelNew, self).__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size, stride=stride, padding=padding)

    def forward(self, x):
        conv = self.conv
        # The 3D convolution stays in cuDNN; its bias, Mish and tanh run in one fused pass.
        y = F.conv3d(x, conv.weight, None, conv.stride, conv.padding, conv.dilation, conv.groups)
        cb = conv.bias if conv.bias is not None else torch.zeros(conv.out_channels, device=y.device, dtype=y.dtype)
        return _ext.conv3d_mish_tanh(y.contiguous(), cb.contiguous(), 0.0)
