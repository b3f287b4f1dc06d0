# expected: kernelbench=correct kernelbench-v0.1=correct numeric=correct - row softmax, one block a row: a running (max, sum) per thread merged across the block, then one write pass
# task: level1/23_Softmax
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = "torch::Tensor softmax_online(torch::Tensor x);"

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <cmath>

// A partial softmax denominator: sum of exp(v - m) over the values seen, with m their maximum.
struct MaxSum { float m; float s; };

__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
    const float m = fmaxf(a.m, b.m);
    if (m == -INFINITY) return {m, 0.0f};
    return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

__global__ void softmax_online_kernel(const float* __restrict__ x, float* __restrict__ y, int cols) {
    __shared__ MaxSum partial[32];
    const float* xr = x + (int64_t)blockIdx.x * cols;
    float* yr = y + (int64_t)blockIdx.x * cols;
    MaxSum acc = {-INFINITY, 0.0f};
    for (int i = threadIdx.x; i < cols; i += blockDim.x) acc = combine(acc, {xr[i], 1.0f});
    for (int off = 16; off > 0; off >>= 1) {
        MaxSum other = {__shfl_xor_sync(0xffffffffu, acc.m, off), __shfl_xor_sync(0xffffffffu, acc.s, off)};
        acc = combine(acc, other);
    }
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    if (lane == 0) partial[warp] = acc;
    __syncthreads();
    if (warp == 0) {
        acc = lane < warps ? partial[lane] : MaxSum{-INFINITY, 0.0f};
        for (int off = 16; off > 0; off >>= 1) {
            MaxSum other = {__shfl_xor_sync(0xffffffffu, acc.m, off), __shfl_xor_sync(0xffffffffu, acc.s, off)};
            acc = combine(acc, other);
        }
        if (lane == 0) partial[0] = acc;
    }
    __syncthreads();
    const float m = partial[0].m, inv = 1.0f / partial[0].s;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) yr[i] = expf(xr[i] - m) * inv;
}

torch::Tensor softmax_online(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.dim() == 2 && x.scalar_type() == torch::kFloat32, "float32 (rows, cols) expected");
    x = x.contiguous();
    auto y = torch::empty_like(x);
    softmax_online_kernel<<<x.size(0), 1024, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), (int)x.size(1));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

ext = load_inline(name="kb_softmax_online", cpp_sources=cpp_source, cuda_sources=cuda_source,
                  functions=["softmax_online"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return ext.softmax_online(x)
