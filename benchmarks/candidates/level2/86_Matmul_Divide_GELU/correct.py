# expected verdict: correct (cuBLAS x @ W^T without bias + one fused kernel: linear bias, divide, exact GELU; one block per row, float4)
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
torch::Tensor matmul_div_gelu(torch::Tensor y, torch::Tensor bias, double p0, double p1, double p2);
"""

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <algorithm>
#include <cstdint>

__device__ __forceinline__ float gelu_f(float v) { return 0.5f * v * (1.0f + erff(v * 0.70710678118654752440f)); }
__device__ __forceinline__ float mish_f(float v) { return v * tanhf(v > 20.0f ? v : log1pf(expf(v))); }

// exact GELU of (v + bias) / divisor
__device__ __forceinline__ float epilogue(float v, float b, float p0, float p1, float p2) {
    return gelu_f((v + b) / p0);
}

// y is (rows, N) contiguous with a bias per column; one block walks one row at a time.
template <bool VEC>
__global__ void matmul_div_gelu_kernel(const float* __restrict__ y, float* __restrict__ out, const float* __restrict__ bias,
                               float p0, float p1, float p2, int64_t rows, int64_t N) {
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const int64_t base = row * N;
        if (VEC) {
            const float4* src = reinterpret_cast<const float4*>(y + base);
            const float4* b4 = reinterpret_cast<const float4*>(bias);
            float4* dst = reinterpret_cast<float4*>(out + base);
            for (int64_t j = threadIdx.x; j < (N >> 2); j += blockDim.x) {
                float4 v = src[j];
                const float4 b = b4[j];
                v.x = epilogue(v.x, b.x, p0, p1, p2);
                v.y = epilogue(v.y, b.y, p0, p1, p2);
                v.z = epilogue(v.z, b.z, p0, p1, p2);
                v.w = epilogue(v.w, b.w, p0, p1, p2);
                dst[j] = v;
            }
        } else {
            for (int64_t j = threadIdx.x; j < N; j += blockDim.x) out[base + j] = epilogue(y[base + j], bias[j], p0, p1, p2);
        }
    }
}

torch::Tensor matmul_div_gelu(torch::Tensor y, torch::Tensor bias, double p0, double p1, double p2) {
    TORCH_CHECK(y.is_cuda() && bias.is_cuda(), "all tensors must be CUDA tensors");
    TORCH_CHECK(y.is_contiguous() && bias.is_contiguous(), "all tensors must be contiguous");
    TORCH_CHECK(y.scalar_type() == torch::kFloat32 && bias.scalar_type() == torch::kFloat32, "all tensors must be float32");
    TORCH_CHECK(y.dim() >= 1, "y must be (..., out_features)");
    const int64_t N = y.size(-1);
    TORCH_CHECK(bias.numel() == N, "bias must have out_features elements");
    auto out = torch::empty_like(y, torch::MemoryFormat::Contiguous);
    if (y.numel() == 0) return out;
    const int64_t rows = y.numel() / N;
    const float* yp = y.data_ptr<float>();
    const float* bp = bias.data_ptr<float>();
    float* op = out.data_ptr<float>();
    const bool vec = (N % 4 == 0) &&
        (((reinterpret_cast<uintptr_t>(yp) | reinterpret_cast<uintptr_t>(op) | reinterpret_cast<uintptr_t>(bp)) & 15) == 0);
    const int threads = 256;
    const int64_t blocks = std::min<int64_t>(rows, (int64_t)1 << 30);
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    if (vec) {
        matmul_div_gelu_kernel<true><<<(unsigned)blocks, threads, 0, stream>>>(yp, op, bp, (float)p0, (float)p1, (float)p2, rows, N);
    } else {
        matmul_div_gelu_kernel<false><<<(unsigned)blocks, threads, 0, stream>>>(yp, op, bp, (float)p0, (float)p1, (float)p2, rows, N);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

_ext = load_inline(
    name="ks_l2_86_matmul_div_gelu_correct",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["matmul_div_gelu"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, input_size, output_size, divisor):
        super(ModelNew, self).__init__()
        self.linear = nn.Linear(input_size, output_size)
        self.divisor = divisor

    def forward(self, x):
        lin = self.linear
        # The GEMM stays in cuBLAS (x @ W^T, no bias); the bias and everything after it run in one fused pass.
        y = torch.matmul(x, lin.weight.t())
        b = lin.bias if lin.bias is not None else torch.zeros(lin.out_features, device=y.device, dtype=y.dtype)
        return _ext.matmul_div_gelu(y.contiguous(), b.contiguous(), float(self.divisor), 0.0, 0.0)
