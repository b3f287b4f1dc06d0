# expect: incorrect/rejected - caches results on the GPU keyed by the input's data_ptr and returns clones
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP = r"""
#include <torch/extension.h>
torch::Tensor leaky_scale_variant(torch::Tensor x, double slope, double scale, int64_t mode);
"""

# One source for the honest kernel and every GPU cheat, so the extension is built once. mode:
# 0 honest, 1 writes the first half only, 2 writes nothing, 3 writes 2^40 floats past the output,
# 4 spins forever on a flag nobody sets, 5 runs on a side stream that the current stream never waits for.
CUDA = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <algorithm>
#include <cstdint>

__global__ void leaky_scale_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t limit,
                                   int64_t offset, float slope, float scale) {
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < limit; i += stride) {
        const float v = x[i];
        y[i + offset] = (v >= 0.0f ? v : v * slope) * scale;
    }
}

__global__ void spin_kernel(const int* flag, float* y) {
    while (*(volatile const int*)flag == 0) {
    }
    y[0] = 0.0f;
}

static cudaStream_t side_stream() {
    static cudaStream_t stream = [] {
        cudaStream_t s;
        C10_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        return s;
    }();
    return stream;
}

static cudaEvent_t ready_event() {
    static cudaEvent_t event = [] {
        cudaEvent_t e;
        C10_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        return e;
    }();
    return event;
}

torch::Tensor leaky_scale_variant(torch::Tensor x, double slope, double scale, int64_t mode) {
    TORCH_CHECK(x.is_cuda() && x.is_contiguous() && x.scalar_type() == torch::kFloat32,
                "x must be a contiguous float32 CUDA tensor");
    auto y = torch::empty_like(x, torch::MemoryFormat::Contiguous);
    const int64_t n = x.numel();
    if (n == 0) return y;
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    if (mode == 4) {
        auto flag = torch::zeros({1}, x.options().dtype(torch::kInt32));
        spin_kernel<<<1, 1, 0, stream>>>(flag.data_ptr<int>(), y.data_ptr<float>());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        return y;
    }
    int64_t limit = n, offset = 0;
    if (mode == 1) limit = n / 2;
    if (mode == 2) limit = 0;
    if (mode == 3) offset = (int64_t)1 << 40;
    if (mode == 5) {
        // Ordered after the work already queued (so the inputs are ready), but the current stream, where
        // the timer's end event goes, never waits for this kernel.
        C10_CUDA_CHECK(cudaEventRecord(ready_event(), stream));
        stream = side_stream();
        C10_CUDA_CHECK(cudaStreamWaitEvent(stream, ready_event(), 0));
    }
    const int threads = 256;
    const int64_t max_blocks = (int64_t)at::cuda::getCurrentDeviceProperties()->multiProcessorCount * 32;
    const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>((limit + threads - 1) / threads, max_blocks));
    leaky_scale_kernel<<<(unsigned)blocks, threads, 0, stream>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), limit, offset, (float)slope, (float)scale);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

ext = load_inline(name="leaky_scale_gpu_variants", cpp_sources=CPP, cuda_sources=CUDA,
                  functions=["leaky_scale_variant"], extra_cuda_cflags=["-O3"])

CACHE = {}


class ModelNew(nn.Module):
    def __init__(self, negative_slope, scale):
        super().__init__()
        self.negative_slope = negative_slope
        self.scale = scale

    def kernel(self, x, mode=0):
        return ext.leaky_scale_variant(x.contiguous(), self.negative_slope, self.scale, mode)

    def forward(self, x):
        key = x.data_ptr()
        if key not in CACHE:
            CACHE[key] = self.kernel(x)
        return CACHE[key].clone()
