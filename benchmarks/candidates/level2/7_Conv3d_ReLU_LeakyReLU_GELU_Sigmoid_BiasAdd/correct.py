# expected verdict: correct (cuDNN conv3d without bias + one fused kernel: conv bias, ReLU, LeakyReLU, exact GELU, sigmoid, bias)
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
torch::Tensor fused_activations_bias(torch::Tensor y, torch::Tensor conv_bias, torch::Tensor bias);
"""

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <algorithm>
#include <cstdint>

__device__ __forceinline__ float epilogue(float v, float cb, float b) {
    v = v + cb;                                             // conv3d's own bias
    v = v < 0.0f ? 0.0f : v;                                // ReLU
    v = v > 0.0f ? v : v * 0.01f;                           // LeakyReLU(0.01)
    v = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f)); // GELU (exact, erf form)
    v = 1.0f / (1.0f + expf(-v));                           // sigmoid
    return v + b;                                           // + self.bias (per channel)
}

// y is (N, C, D*H*W) contiguous; one block walks one (n, c) volume at a time.
template <bool VEC>
__global__ void epilogue_kernel(const float* __restrict__ y, float* __restrict__ out,
                                const float* __restrict__ conv_bias, const float* __restrict__ bias,
                                int64_t planes, int64_t C, int64_t P) {
    for (int64_t plane = blockIdx.x; plane < planes; plane += gridDim.x) {
        const int64_t c = plane % C;
        const float cb = conv_bias[c];
        const float b = bias[c];
        const int64_t base = plane * P;
        if (VEC) {
            const float4* src = reinterpret_cast<const float4*>(y + base);
            float4* dst = reinterpret_cast<float4*>(out + base);
            const int64_t n4 = P >> 2;
            for (int64_t i = threadIdx.x; i < n4; i += blockDim.x) {
                float4 v = src[i];
                v.x = epilogue(v.x, cb, b);
                v.y = epilogue(v.y, cb, b);
                v.z = epilogue(v.z, cb, b);
                v.w = epilogue(v.w, cb, b);
                dst[i] = v;
            }
        } else {
            for (int64_t i = threadIdx.x; i < P; i += blockDim.x) out[base + i] = epilogue(y[base + i], cb, b);
        }
    }
}

torch::Tensor fused_activations_bias(torch::Tensor y, torch::Tensor conv_bias, torch::Tensor bias) {
    TORCH_CHECK(y.is_cuda() && conv_bias.is_cuda() && bias.is_cuda(), "all tensors must be CUDA tensors");
    TORCH_CHECK(y.is_contiguous() && conv_bias.is_contiguous() && bias.is_contiguous(), "all tensors must be contiguous");
    TORCH_CHECK(y.scalar_type() == torch::kFloat32 && conv_bias.scalar_type() == torch::kFloat32 &&
                bias.scalar_type() == torch::kFloat32, "all tensors must be float32");
    TORCH_CHECK(y.dim() >= 2, "y must be (N, C, ...)");
    const int64_t C = y.size(1);
    TORCH_CHECK(conv_bias.numel() == C && bias.numel() == C, "biases must have C elements");
    auto out = torch::empty_like(y, torch::MemoryFormat::Contiguous);
    if (y.numel() == 0) return out;
    const int64_t planes = y.size(0) * C;
    const int64_t P = y.numel() / planes;
    const float* yp = y.data_ptr<float>();
    float* op = out.data_ptr<float>();
    const bool vec = (P % 4 == 0) &&
        (((reinterpret_cast<uintptr_t>(yp) | reinterpret_cast<uintptr_t>(op)) & 15) == 0);
    const int threads = 256;
    const int64_t blocks = std::min<int64_t>(planes, (int64_t)1 << 30);
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    if (vec) {
        epilogue_kernel<true><<<(unsigned)blocks, threads, 0, stream>>>(
            yp, op, conv_bias.data_ptr<float>(), bias.data_ptr<float>(), planes, C, P);
    } else {
        epilogue_kernel<false><<<(unsigned)blocks, threads, 0, stream>>>(
            yp, op, conv_bias.data_ptr<float>(), bias.data_ptr<float>(), planes, C, P);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

_ext = load_inline(
    name="ks_l2_7_conv3d_acts_bias_correct",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["fused_activations_bias"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super(ModelNew, self).__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        conv = self.conv
        # The convolution stays in cuDNN; its bias is folded into the fused epilogue below.
        y = F.conv3d(x, conv.weight, None, conv.stride, conv.padding, conv.dilation, conv.groups)
        cb = conv.bias if conv.bias is not None else torch.zeros(conv.out_channels, device=y.device, dtype=y.dtype)
        return _ext.fused_activations_bias(y.contiguous(), cb.contiguous(), self.bias.contiguous())
