# expected: kernelbench=incorrect kernelbench-v0.1=incorrect numeric=incorrect - HardTanh with an off-by-one bound: the last element is never written (one wrong element in millions)
# task: level1/32_HardTanh
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = "torch::Tensor hardtanh_off_by_one(torch::Tensor x);"

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

__global__ void hardtanh_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n - 1) y[i] = fminf(fmaxf(x[i], -1.0f), 1.0f);  // bug: should be i < n
}

torch::Tensor hardtanh_off_by_one(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "float32 CUDA tensor expected");
    x = x.contiguous();
    auto y = torch::empty_like(x);
    const int64_t n = x.numel();
    const int threads = 256;
    const int64_t blocks = (n + threads - 1) / threads;
    hardtanh_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

ext = load_inline(name="kb_hardtanh_off_by_one", cpp_sources=cpp_source, cuda_sources=cuda_source,
                  functions=["hardtanh_off_by_one"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return ext.hardtanh_off_by_one(x)
