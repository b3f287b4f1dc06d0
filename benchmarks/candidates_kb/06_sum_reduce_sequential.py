# expected: kernelbench=correct kernelbench-v0.1=correct numeric=correct - sum over dim 1, one thread per output, a sequential float32 loop (the task's reduce_dim constant picks the kernel)
# task: level1/47_Sum_reduction_over_a_dimension
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = "torch::Tensor sum_middle(torch::Tensor x);"

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

// x: (B, R, C) contiguous; out[b, 0, c] = sum_r x[b, r, c]. Neighbouring threads read neighbouring columns.
__global__ void sum_middle_kernel(const float* __restrict__ x, float* __restrict__ out, int B, int R, int C) {
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)B * C) return;
    const int b = idx / C, c = idx % C;
    const float* p = x + (int64_t)b * R * C + c;
    float acc = 0.0f;
    for (int r = 0; r < R; ++r) acc += p[(int64_t)r * C];
    out[idx] = acc;
}

torch::Tensor sum_middle(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.dim() == 3 && x.scalar_type() == torch::kFloat32, "expected a float32 (B, R, C) tensor");
    x = x.contiguous();
    const int B = x.size(0), R = x.size(1), C = x.size(2);
    auto out = torch::empty({B, 1, C}, x.options());
    const int threads = 256;
    const int64_t blocks = ((int64_t)B * C + threads - 1) / threads;
    sum_middle_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), out.data_ptr<float>(), B, R, C);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

ext = load_inline(name="kb_sum_middle", cpp_sources=cpp_source, cuda_sources=cuda_source,
                  functions=["sum_middle"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        assert reduce_dim == 1 == self.dim, "this kernel reduces the middle dimension"  # noqa: F821 - the task's constant
        return ext.sum_middle(x)
