# expected: kernelbench=correct kernelbench-v0.1=correct numeric=correct - tiled float32 GEMM with bias, multiplier and LeakyReLU fused, the last two read from the task's constants
# task: level2/12_Gemm_Multiply_LeakyReLU
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = "torch::Tensor gemm_mul_leaky(torch::Tensor x, torch::Tensor w, torch::Tensor b, double multiplier, double slope);"

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#define TILE 32

// y[i, j] = leaky((sum_k x[i, k] * w[j, k] + b[j]) * multiplier): nn.Linear's weight is (out, in), row-major.
__global__ void gemm_mul_leaky_kernel(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ bias,
                                      float* __restrict__ y, int M, int K, int N, float multiplier, float slope) {
    __shared__ float xs[TILE][TILE];
    __shared__ float ws[TILE][TILE + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row = blockIdx.y * TILE + ty;       // batch row of x and y
    const int col = blockIdx.x * TILE + tx;       // output feature of y
    const int wrow = blockIdx.x * TILE + ty;      // the weight row this thread loads
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        xs[ty][tx] = (row < M && k0 + tx < K) ? x[(int64_t)row * K + k0 + tx] : 0.0f;
        ws[ty][tx] = (wrow < N && k0 + tx < K) ? w[(int64_t)wrow * K + k0 + tx] : 0.0f;
        __syncthreads();
        #pragma unroll
        for (int k = 0; k < TILE; ++k) acc += xs[ty][k] * ws[tx][k];
        __syncthreads();
    }
    if (row < M && col < N) {
        float v = (acc + bias[col]) * multiplier;
        y[(int64_t)row * N + col] = v >= 0.0f ? v : v * slope;
    }
}

torch::Tensor gemm_mul_leaky(torch::Tensor x, torch::Tensor w, torch::Tensor b, double multiplier, double slope) {
    TORCH_CHECK(x.is_cuda() && w.is_cuda() && b.is_cuda() && x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1),
                "bad inputs");
    x = x.contiguous();
    w = w.contiguous();
    b = b.contiguous();
    const int M = x.size(0), K = x.size(1), N = w.size(0);
    auto y = torch::empty({M, N}, x.options());
    const dim3 block(TILE, TILE);
    const dim3 grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
    gemm_mul_leaky_kernel<<<grid, block, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), w.data_ptr<float>(), b.data_ptr<float>(), y.data_ptr<float>(), M, K, N,
        (float)multiplier, (float)slope);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

ext = load_inline(name="kb_gemm_mul_leaky", cpp_sources=cpp_source, cuda_sources=cuda_source,
                  functions=["gemm_mul_leaky"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, multiplier, negative_slope):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)

    def forward(self, x):
        # `multiplier` and `negative_slope`: the task file's module-level constants, as KernelBench defines them
        return ext.gemm_mul_leaky(x, self.gemm.weight, self.gemm.bias, multiplier, negative_slope)  # noqa: F821
