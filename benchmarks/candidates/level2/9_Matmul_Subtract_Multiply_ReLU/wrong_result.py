# expected verdict: incorrect (wrong_result: sign error, adds subtract_value instead of subtracting it)
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
torch::Tensor bias_sub_mul_relu(torch::Tensor y, torch::Tensor bias, double sub, double mul);
"""

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <algorithm>
#include <cstdint>

__device__ __forceinline__ float epilogue(float v, float b, float sub, float mul) {
    v = v + b;             // nn.Linear's bias
    v = (v + sub) * mul;   // BUG (deliberate): + instead of - subtract_value
    return v < 0.0f ? 0.0f : v;  // ReLU
}

// y is (rows, N) contiguous with a bias per column; one block walks one row at a time.
template <bool VEC>
__global__ void epilogue_kernel(const float* __restrict__ y, float* __restrict__ out,
                                const float* __restrict__ bias, float sub, float mul,
                                int64_t rows, int64_t N) {
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const int64_t base = row * N;
        if (VEC) {
            const float4* src = reinterpret_cast<const float4*>(y + base);
            const float4* b4 = reinterpret_cast<const float4*>(bias);
            float4* dst = reinterpret_cast<float4*>(out + base);
            const int64_t n4 = N >> 2;
            for (int64_t j = threadIdx.x; j < n4; j += blockDim.x) {
                float4 v = src[j];
                const float4 b = b4[j];
                v.x = epilogue(v.x, b.x, sub, mul);
                v.y = epilogue(v.y, b.y, sub, mul);
                v.z = epilogue(v.z, b.z, sub, mul);
                v.w = epilogue(v.w, b.w, sub, mul);
                dst[j] = v;
            }
        } else {
            for (int64_t j = threadIdx.x; j < N; j += blockDim.x) out[base + j] = epilogue(y[base + j], bias[j], sub, mul);
        }
    }
}

torch::Tensor bias_sub_mul_relu(torch::Tensor y, torch::Tensor bias, double sub, double mul) {
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
        epilogue_kernel<true><<<(unsigned)blocks, threads, 0, stream>>>(yp, op, bp, (float)sub, (float)mul, rows, N);
    } else {
        epilogue_kernel<false><<<(unsigned)blocks, threads, 0, stream>>>(yp, op, bp, (float)sub, (float)mul, rows, N);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

_ext = load_inline(
    name="ks_l2_9_matmul_sub_mul_relu_wrong_result",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["bias_sub_mul_relu"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, subtract_value, multiply_value):
        super(ModelNew, self).__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.subtract_value = subtract_value
        self.multiply_value = multiply_value

    def forward(self, x):
        lin = self.linear
        # The GEMM stays in cuBLAS; the bias add is folded into the fused epilogue.
        y = torch.matmul(x, lin.weight.t())
        b = lin.bias if lin.bias is not None else torch.zeros(lin.out_features, device=y.device, dtype=y.dtype)
        return _ext.bias_sub_mul_relu(y.contiguous(), b.contiguous(),
                                      float(self.subtract_value), float(self.multiply_value))
