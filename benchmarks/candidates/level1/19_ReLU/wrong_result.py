# expected verdict: incorrect (wrong_result: off-by-one index, out[i] = relu(x[i+1]))
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
torch::Tensor relu_forward(torch::Tensor x);
"""

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <algorithm>
#include <cstdint>

__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        // BUG (deliberate): off by one, reads the neighbour (clamped so it stays in bounds).
        const int64_t j = (i + 1 < n) ? i + 1 : i;
        const float v = x[j];
        y[i] = v < 0.0f ? 0.0f : v;
    }
}

torch::Tensor relu_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "relu_forward: x must be a CUDA tensor");
    TORCH_CHECK(x.is_contiguous(), "relu_forward: x must be contiguous");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "relu_forward: x must be float32");
    auto y = torch::empty_like(x, torch::MemoryFormat::Contiguous);
    const int64_t n = x.numel();
    if (n == 0) return y;
    const int threads = 256;
    const int64_t max_blocks = (int64_t)at::cuda::getCurrentDeviceProperties()->multiProcessorCount * 32;
    const int64_t blocks = std::min((n + threads - 1) / threads, max_blocks);
    relu_kernel<<<(unsigned)blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

_ext = load_inline(
    name="ks_l1_19_relu_wrong_result",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["relu_forward"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.relu_forward(x.contiguous())
