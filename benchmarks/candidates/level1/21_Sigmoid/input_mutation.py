# expected verdict: rejected/incorrect (input_mutation: writes sigmoid(x) into x in place and returns x)
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
torch::Tensor sigmoid_inplace(torch::Tensor x);
"""

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <algorithm>
#include <cstdint>

__global__ void sigmoid_inplace_kernel(float* __restrict__ x, int64_t n) {
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        x[i] = 1.0f / (1.0f + expf(-x[i]));
    }
}

// BUG (deliberate): the result overwrites the caller's input tensor, which is then returned.
torch::Tensor sigmoid_inplace(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "sigmoid_inplace: x must be a CUDA tensor");
    TORCH_CHECK(x.is_contiguous(), "sigmoid_inplace: x must be contiguous");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "sigmoid_inplace: x must be float32");
    const int64_t n = x.numel();
    if (n == 0) return x;
    const int threads = 256;
    const int64_t max_blocks = (int64_t)at::cuda::getCurrentDeviceProperties()->multiProcessorCount * 32;
    const int64_t blocks = std::min((n + threads - 1) / threads, max_blocks);
    sigmoid_inplace_kernel<<<(unsigned)blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return x;
}
"""

_ext = load_inline(
    name="ks_l1_21_sigmoid_input_mutation",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["sigmoid_inplace"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.sigmoid_inplace(x)
