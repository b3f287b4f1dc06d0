# expected verdict: correct (cuDNN transposed conv without bias + one fused kernel: both biases, clamp, scale, clamp, divide)
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
torch::Tensor bias_clamp_scale_clamp_div(torch::Tensor y, torch::Tensor conv_bias, torch::Tensor bias, double scale);
"""

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <algorithm>
#include <cstdint>

__device__ __forceinline__ float epilogue(float v, float cb, float b, float s) {
    v = v + cb;                           // the transposed convolution's own bias
    v = v + b;                            // + self.bias
    v = fminf(fmaxf(v, 0.0f), 1.0f);      // clamp(0, 1)
    v = v * s;                            // * scaling_factor
    v = fminf(fmaxf(v, 0.0f), 1.0f);      // clamp(0, 1)
    return v / s;                         // / scaling_factor
}

template <bool VEC>
__global__ void epilogue_kernel(const float* __restrict__ y, float* __restrict__ out,
                                const float* __restrict__ conv_bias, const float* __restrict__ bias,
                                float s, int64_t planes, int64_t C, int64_t HW) {
    for (int64_t plane = blockIdx.x; plane < planes; plane += gridDim.x) {
        const int64_t c = plane % C;
        const float cb = conv_bias[c];
        const float b = bias[c];
        const int64_t base = plane * HW;
        if (VEC) {
            const float4* src = reinterpret_cast<const float4*>(y + base);
            float4* dst = reinterpret_cast<float4*>(out + base);
            const int64_t n4 = HW >> 2;
            for (int64_t i = threadIdx.x; i < n4; i += blockDim.x) {
                float4 v = src[i];
                v.x = epilogue(v.x, cb, b, s);
                v.y = epilogue(v.y, cb, b, s);
                v.z = epilogue(v.z, cb, b, s);
                v.w = epilogue(v.w, cb, b, s);
                dst[i] = v;
            }
        } else {
            for (int64_t i = threadIdx.x; i < HW; i += blockDim.x) out[base + i] = epilogue(y[base + i], cb, b, s);
        }
    }
}

torch::Tensor bias_clamp_scale_clamp_div(torch::Tensor y, torch::Tensor conv_bias, torch::Tensor bias, double scale) {
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
    const int64_t HW = y.numel() / planes;
    const float* yp = y.data_ptr<float>();
    float* op = out.data_ptr<float>();
    const bool vec = (HW % 4 == 0) &&
        (((reinterpret_cast<uintptr_t>(yp) | reinterpret_cast<uintptr_t>(op)) & 15) == 0);
    const int threads = 256;
    const int64_t blocks = std::min<int64_t>(planes, (int64_t)1 << 30);
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    if (vec) {
        epilogue_kernel<true><<<(unsigned)blocks, threads, 0, stream>>>(
            yp, op, conv_bias.data_ptr<float>(), bias.data_ptr<float>(), (float)scale, planes, C, HW);
    } else {
        epilogue_kernel<false><<<(unsigned)blocks, threads, 0, stream>>>(
            yp, op, conv_bias.data_ptr<float>(), bias.data_ptr<float>(), (float)scale, planes, C, HW);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

_ext = load_inline(
    name="ks_l2_2_convt_clamp_correct",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["bias_clamp_scale_clamp_div"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, output_padding, bias_shape, scaling_factor):
        super(ModelNew, self).__init__()
        self.conv_transpose = nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding, output_padding=output_padding)
        self.bias = nn.Parameter(torch.randn(bias_shape))
        self.scaling_factor = scaling_factor

    def forward(self, x):
        ct = self.conv_transpose
        # The transposed convolution stays in cuDNN; its bias is folded into the fused epilogue.
        y = F.conv_transpose2d(x, ct.weight, None, ct.stride, ct.padding, ct.output_padding, ct.groups, ct.dilation)
        cb = ct.bias if ct.bias is not None else torch.zeros(ct.out_channels, device=y.device, dtype=y.dtype)
        return _ext.bias_clamp_scale_clamp_div(y.contiguous(), cb.contiguous(), self.bias.contiguous(),
                                               float(self.scaling_factor))
