# expected: kernelbench=correct kernelbench-v0.1=correct numeric=correct - one thread per output, a sequential float32 loop over K=131072 (the least accurate order; numeric at about half its bound)
# task: level1/6_Matmul_with_large_K_dimension_
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = "torch::Tensor matmul_large_k(torch::Tensor A, torch::Tensor B);"

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

__global__ void matmul_large_k_kernel(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
                                    int M, int K, int N) {
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    const int row = blockIdx.y * blockDim.y + threadIdx.y;
    if (row >= M || col >= N) return;
    const float* a = A + (int64_t)row * K;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc += a[k] * B[(int64_t)k * N + col];
    C[(int64_t)row * N + col] = acc;
}

torch::Tensor matmul_large_k(torch::Tensor A, torch::Tensor B) {
    TORCH_CHECK(A.is_cuda() && B.is_cuda() && A.dim() == 2 && B.dim() == 2 && A.size(1) == B.size(0), "bad inputs");
    A = A.contiguous().to(torch::kFloat32);
    B = B.contiguous().to(torch::kFloat32);
    const int M = A.size(0), K = A.size(1), N = B.size(1);
    auto C = torch::empty({M, N}, A.options());
    const dim3 block(32, 8);
    const dim3 grid((N + block.x - 1) / block.x, (M + block.y - 1) / block.y);
    matmul_large_k_kernel<<<grid, block, 0, at::cuda::getCurrentCUDAStream()>>>(
        A.data_ptr<float>(), B.data_ptr<float>(), C.data_ptr<float>(), M, K, N);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return C;
}
"""

ext = load_inline(name="kb_matmul_large_k_naive", cpp_sources=cpp_source, cuda_sources=cuda_source,
                  functions=["matmul_large_k"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return ext.matmul_large_k(A, B)
