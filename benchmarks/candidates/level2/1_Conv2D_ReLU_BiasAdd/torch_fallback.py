# expected verdict: rejected (torch_fallback: compiles an epilogue kernel but forward is conv + torch.relu + add in PyTorch)
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
torch::Tensor relu_bias(torch::Tensor y, torch::Tensor bias);
"""

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <cstdint>

__global__ void relu_bias_kernel(const float* __restrict__ y, float* __restrict__ out,
                                 const float* __restrict__ bias, int64_t n, int64_t C, int64_t HW) {
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = y[i];
        out[i] = (v < 0.0f ? 0.0f : v) + bias[(i / HW) % C];
    }
}

torch::Tensor relu_bias(torch::Tensor y, torch::Tensor bias) {
    TORCH_CHECK(y.is_cuda() && bias.is_cuda(), "tensors must be CUDA tensors");
    TORCH_CHECK(y.is_contiguous() && bias.is_contiguous(), "tensors must be contiguous");
    TORCH_CHECK(y.scalar_type() == torch::kFloat32 && bias.scalar_type() == torch::kFloat32, "float32 only");
    auto out = torch::empty_like(y);
    const int64_t n = y.numel();
    if (n == 0) return out;
    const int64_t C = y.size(1), HW = n / (y.size(0) * C);
    const int threads = 256;
    const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 65535);
    relu_bias_kernel<<<(unsigned)blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        y.data_ptr<float>(), out.data_ptr<float>(), bias.data_ptr<float>(), n, C, HW);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

# Built, but never called: forward below only uses PyTorch operators.
_ext = load_inline(
    name="ks_l2_1_conv_relu_bias_torch_fallback",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["relu_bias"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super(ModelNew, self).__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        x = self.conv(x)
        x = torch.relu(x)
        return x + self.bias
