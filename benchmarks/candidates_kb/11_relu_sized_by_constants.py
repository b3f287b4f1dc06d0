# expected: kernelbench=incorrect kernelbench-v0.1=incorrect numeric=incorrect - ReLU whose output is allocated from the task's batch_size and dim: right at the task's size, the wrong shape at the second, smaller one
# task: level1/19_ReLU
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = "torch::Tensor relu_sized(torch::Tensor x, int64_t rows, int64_t cols);"

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

__global__ void relu_sized_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        y[i] = fmaxf(x[i], 0.0f);
    }
}

// The output is (rows, cols) as the task file says; only as many elements as both tensors hold are written.
torch::Tensor relu_sized(torch::Tensor x, int64_t rows, int64_t cols) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "float32 CUDA tensor expected");
    x = x.contiguous();
    auto y = torch::zeros({rows, cols}, x.options());
    const int64_t n = std::min<int64_t>(x.numel(), y.numel());
    const int threads = 256;
    const int blocks = (int)std::min<int64_t>((n + threads - 1) / threads, 65535);
    relu_sized_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

ext = load_inline(name="kb_relu_sized", cpp_sources=cpp_source, cuda_sources=cuda_source,
                  functions=["relu_sized"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return ext.relu_sized(x, batch_size, dim)  # noqa: F821 - the task file's constants
