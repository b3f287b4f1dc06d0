# expected verdict: incorrect (partial_output: only the first half of the (batch, spatial) columns is written; the rest stays torch::empty garbage)
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
torch::Tensor rmsnorm_forward(torch::Tensor x, double eps);
"""

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <algorithm>
#include <cstdint>

// x viewed as (B, C, S): S = product of the dims after dim 1. Each thread owns one (b, s)
// column (or 4 adjacent columns in the float4 version); consecutive threads read consecutive
// addresses for every c, so the strided reduction over C stays coalesced.
__global__ void rmsnorm_scalar_kernel(const float* __restrict__ x, float* __restrict__ y,
                                      int64_t B, int64_t C, int64_t S, float eps) {
    // BUG (deliberate): only the first half of the columns is normalised and written.
    const int64_t total = (B * S) / 2;
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const int64_t b = idx / S;
        const int64_t s = idx - b * S;
        const float* xp = x + b * C * S + s;
        float* yp = y + b * C * S + s;
        float acc = 0.0f;
        for (int64_t c = 0; c < C; ++c) {
            const float v = xp[c * S];
            acc += v * v;
        }
        const float rms = sqrtf(acc / (float)C + eps);
        for (int64_t c = 0; c < C; ++c) yp[c * S] = xp[c * S] / rms;
    }
}

__global__ void rmsnorm_vec4_kernel(const float* __restrict__ x, float* __restrict__ y,
                                    int64_t B, int64_t C, int64_t S, float eps) {
    const int64_t S4 = S >> 2;
    // BUG (deliberate): only the first half of the columns is normalised and written.
    const int64_t total = (B * S4) / 2;
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const int64_t b = idx / S4;
        const int64_t s4 = idx - b * S4;
        const float4* xp = reinterpret_cast<const float4*>(x + b * C * S) + s4;
        float4* yp = reinterpret_cast<float4*>(y + b * C * S) + s4;
        float ax = 0.f, ay = 0.f, az = 0.f, aw = 0.f;
        for (int64_t c = 0; c < C; ++c) {
            const float4 v = xp[c * S4];
            ax += v.x * v.x; ay += v.y * v.y; az += v.z * v.z; aw += v.w * v.w;
        }
        const float fC = (float)C;
        const float rx = sqrtf(ax / fC + eps), ry = sqrtf(ay / fC + eps);
        const float rz = sqrtf(az / fC + eps), rw = sqrtf(aw / fC + eps);
        for (int64_t c = 0; c < C; ++c) {
            float4 v = xp[c * S4];
            v.x = v.x / rx; v.y = v.y / ry; v.z = v.z / rz; v.w = v.w / rw;
            yp[c * S4] = v;
        }
    }
}

torch::Tensor rmsnorm_forward(torch::Tensor x, double eps) {
    TORCH_CHECK(x.is_cuda(), "rmsnorm_forward: x must be a CUDA tensor");
    TORCH_CHECK(x.dim() >= 2, "rmsnorm_forward: x must have shape (batch, features, *)");
    TORCH_CHECK(x.is_contiguous(), "rmsnorm_forward: x must be contiguous");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "rmsnorm_forward: x must be float32");
    auto y = torch::empty_like(x, torch::MemoryFormat::Contiguous);
    const int64_t B = x.size(0), C = x.size(1);
    if (x.numel() == 0) return y;
    const int64_t S = x.numel() / (B * C);

    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    const bool vec = (S % 4 == 0) &&
        (((reinterpret_cast<uintptr_t>(xp) | reinterpret_cast<uintptr_t>(yp)) & 15) == 0);
    const int threads = 256;
    const int64_t max_blocks = (int64_t)at::cuda::getCurrentDeviceProperties()->multiProcessorCount * 32;
    const int64_t work = vec ? B * (S / 4) : B * S;
    const int64_t blocks = std::min((work + threads - 1) / threads, max_blocks);
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    if (vec) {
        rmsnorm_vec4_kernel<<<(unsigned)blocks, threads, 0, stream>>>(xp, yp, B, C, S, (float)eps);
    } else {
        rmsnorm_scalar_kernel<<<(unsigned)blocks, threads, 0, stream>>>(xp, yp, B, C, S, (float)eps);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

_ext = load_inline(
    name="ks_l1_36_rmsnorm_partial_output",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["rmsnorm_forward"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, num_features: int, eps: float = 1e-5):
        super(ModelNew, self).__init__()
        self.num_features = num_features
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.rmsnorm_forward(x.contiguous(), float(self.eps))
