"""Writes completions.jsonl: the demo's bundled pool of recorded completions (`kernelsearch demo`).

Each line is one completion as a code model would answer (a sentence of prose, then a ```python block),
with `task`, `backend` (cpp: runs on a CPU oracle; cuda: a GPU oracle), `variant` and `expect` (the
oracle's verdict the demo expects). Per task and backend the variants share ONE extension source and
differ in the Python around it, so a cold build cache compiles each extension once (the compile-error
variant fails on its flags before compiling anything):

  fast          correct, one call of the fused kernel: faster than eager PyTorch
  slow          correct, but drives the kernel from a Python loop: slower than eager
  wrong         a bug in the glue (swapped arguments, wrong axis, gain applied twice): incorrect
  compile_error nvcc-only flags given to the host C++ compiler: compile_error
  crash         the kernel's own checks throw at run time: runtime_error
  cheat         PyTorch does the work, or the output overwrites the input: rejected

Run `python search/demo_data/build_completions.py` after editing this file.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXPECT = {"fast": "correct", "slow": "correct", "wrong": "incorrect", "compile_error": "compile_error",
          "crash": "runtime_error", "cheat": "rejected"}

# ---------------------------------------------------------------- builtin/1_LeakyReLU_Scale

LEAKY_CPP = r'''
#include <torch/extension.h>
#include <ATen/Parallel.h>

// y = scale * leaky_relu(x) in one pass over memory, split over the CPU threads.
torch::Tensor leaky_relu_scale(torch::Tensor x, double negative_slope, double scale) {
    TORCH_CHECK(x.device().is_cpu(), "x must be a CPU tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "x must be float32");
    TORCH_CHECK(x.is_contiguous(), "x must be contiguous");
    auto y = torch::empty_like(x);
    const float* in = x.data_ptr<float>();
    float* out = y.data_ptr<float>();
    const float pos = static_cast<float>(scale);
    const float neg = static_cast<float>(negative_slope * scale);
    at::parallel_for(0, x.numel(), 1 << 14, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
            const float v = in[i];
            out[i] = v * (v >= 0.0f ? pos : neg);
        }
    });
    return y;
}
'''

LEAKY_CUDA = r'''
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

// y = scale * leaky_relu(x) in one pass: a grid-stride loop, one element per thread per step.
__global__ void leaky_relu_scale_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n,
                                        float pos, float neg) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float v = x[i];
        y[i] = v * (v >= 0.0f ? pos : neg);
    }
}

torch::Tensor leaky_relu_scale(torch::Tensor x, double negative_slope, double scale) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "x must be float32");
    TORCH_CHECK(x.is_contiguous(), "x must be contiguous");
    auto y = torch::empty_like(x);
    const int64_t n = x.numel();
    if (n == 0) return y;
    const int threads = 256;
    const int blocks = (int)std::min<int64_t>((n + threads - 1) / threads, 8192);
    leaky_relu_scale_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), n, (float)scale, (float)(negative_slope * scale));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
'''

LEAKY_DECL = "torch::Tensor leaky_relu_scale(torch::Tensor x, double negative_slope, double scale);"

LEAKY_INIT = '''
class ModelNew(nn.Module):
    def __init__(self, negative_slope: float, scale: float):
        super().__init__()
        self.negative_slope = negative_slope
        self.scale = scale
'''

LEAKY_FORWARD = {
    "fast": '''
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return leaky_ext.leaky_relu_scale(x.contiguous(), self.negative_slope, self.scale)
''',
    "slow": '''
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Work in 512-element tiles so each call stays in the L1 cache.
        flat = x.contiguous().view(-1)
        tiles = [leaky_ext.leaky_relu_scale(t, self.negative_slope, self.scale) for t in flat.split(512)]
        return torch.cat(tiles).view_as(x)
''',
    "wrong": '''
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return leaky_ext.leaky_relu_scale(x.contiguous(), self.scale, self.negative_slope)
''',
    "compile_error": None,  # the fast forward, built with the wrong flags
    "crash": '''
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Half precision halves the memory traffic of this memory-bound op.
        return leaky_ext.leaky_relu_scale(x.half().contiguous(), self.negative_slope, self.scale).float()
''',
    "cheat": '''
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Warm the kernel up on the first row, then take the well-tested PyTorch path for the full tensor.
        leaky_ext.leaky_relu_scale(x[:1].contiguous(), self.negative_slope, self.scale)
        return torch.nn.functional.leaky_relu(x, self.negative_slope) * self.scale
''',
}

LEAKY_PROSE = {
    "fast": "Fusing the LeakyReLU and the scale into one kernel reads and writes the tensor once instead of twice; "
            "the negative slope and the scale fold into a single multiplier per branch.",
    "slow": "This kernel applies LeakyReLU and the scale in one pass; the wrapper feeds it cache-sized tiles.",
    "wrong": "Here is a fused LeakyReLU-and-scale kernel that makes a single pass over memory.",
    "compile_error": "A fused LeakyReLU-and-scale kernel, compiled with fast math for extra speed.",
    "crash": "A fused LeakyReLU-and-scale kernel; the wrapper runs it in half precision to save bandwidth.",
    "cheat": "Below is the custom kernel, with a PyTorch path kept for robustness.",
}

# ---------------------------------------------------------------- builtin/4_RMSNorm_LastDim

RMS_CPP = r'''
#include <torch/extension.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <cmath>

// One row per step: the mean of squares (8 partial sums so the loop vectorises), then the rescale.
template <typename scalar_t>
static void rms_norm_rows(const scalar_t* x, const scalar_t* w, scalar_t* y, int64_t rows, int64_t hidden, double eps) {
    at::parallel_for(0, rows, 8, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
            const scalar_t* xr = x + r * hidden;
            scalar_t* yr = y + r * hidden;
            scalar_t acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            int64_t j = 0;
            for (; j + 8 <= hidden; j += 8)
                for (int k = 0; k < 8; ++k) acc[k] += xr[j + k] * xr[j + k];
            scalar_t ss = 0;
            for (int k = 0; k < 8; ++k) ss += acc[k];
            for (; j < hidden; ++j) ss += xr[j] * xr[j];
            const scalar_t inv = scalar_t(1) / std::sqrt(ss / scalar_t(hidden) + scalar_t(eps));
            for (j = 0; j < hidden; ++j) yr[j] = xr[j] * inv * w[j];
        }
    });
}

torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps) {
    TORCH_CHECK(x.device().is_cpu(), "x must be a CPU tensor");
    TORCH_CHECK(x.is_contiguous() && weight.is_contiguous(), "x and weight must be contiguous");
    TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1), "weight must be 1-D with x.size(-1) elements");
    TORCH_CHECK(weight.scalar_type() == x.scalar_type(), "x and weight must have the same dtype");
    auto y = torch::empty_like(x);
    const int64_t hidden = x.size(-1);
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "rms_norm", [&] {
        rms_norm_rows<scalar_t>(x.data_ptr<scalar_t>(), weight.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(),
                                x.numel() / hidden, hidden, eps);
    });
    return y;
}
'''

RMS_CUDA = r'''
#include <torch/extension.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

// One block per row: a block-wide sum of squares (warp shuffles, then one warp over the partials),
// then every thread rescales its strided share of the row.
template <typename scalar_t>
__global__ void rms_norm_kernel(const scalar_t* __restrict__ x, const scalar_t* __restrict__ w,
                                scalar_t* __restrict__ y, int64_t hidden, float eps) {
    const scalar_t* xr = x + blockIdx.x * hidden;
    scalar_t* yr = y + blockIdx.x * hidden;
    float ss = 0.f;
    for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
        const float v = (float)xr[j];
        ss += v * v;
    }
    __shared__ float partial[32];
    for (int off = 16; off > 0; off >>= 1) ss += __shfl_down_sync(0xffffffff, ss, off);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        ss = threadIdx.x < (blockDim.x >> 5) ? partial[threadIdx.x] : 0.f;
        for (int off = 16; off > 0; off >>= 1) ss += __shfl_down_sync(0xffffffff, ss, off);
        if (threadIdx.x == 0) partial[0] = ss;
    }
    __syncthreads();
    const float inv = rsqrtf(partial[0] / (float)hidden + eps);
    for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) yr[j] = (scalar_t)((float)xr[j] * inv * (float)w[j]);
}

torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    TORCH_CHECK(x.is_contiguous() && weight.is_contiguous(), "x and weight must be contiguous");
    TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1), "weight must be 1-D with x.size(-1) elements");
    TORCH_CHECK(weight.scalar_type() == x.scalar_type(), "x and weight must have the same dtype");
    auto y = torch::empty_like(x);
    const int64_t hidden = x.size(-1);
    const int64_t rows = x.numel() / hidden;
    if (rows == 0) return y;
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "rms_norm", [&] {
        rms_norm_kernel<scalar_t><<<rows, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
            x.data_ptr<scalar_t>(), weight.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), hidden, (float)eps);
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
'''

RMS_DECL = "torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps);"

RMS_INIT = '''
class ModelNew(nn.Module):
    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))
'''

RMS_FORWARD = {
    "fast": '''
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_ext.rms_norm(x.contiguous(), self.weight, self.eps)
''',
    "slow": '''
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise each row on its own, accumulating in double precision for numerical safety.
        rows = x.contiguous().view(-1, x.shape[-1])
        weight = self.weight.double()
        out = torch.empty_like(rows)
        for i in range(rows.shape[0]):
            out[i] = rms_ext.rms_norm(rows[i].double(), weight, self.eps)
        return out.view_as(x)
''',
    "wrong": '''
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = rms_ext.rms_norm(x.contiguous(), self.weight, self.eps)
        return y * self.weight  # apply the learned gain
''',
    "compile_error": None,
    "crash": '''
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Give the gain a leading axis so it broadcasts over the rows.
        return rms_ext.rms_norm(x.contiguous(), self.weight.view(1, -1), self.eps)
''',
    "cheat": '''
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inv_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return x * inv_rms * self.weight
''',
}

RMS_PROSE = {
    "fast": "RMSNorm fuses into one kernel: each row's mean of squares is reduced and the row rescaled by the gain "
            "in the same pass, where eager PyTorch makes several passes over the tensor.",
    "slow": "A fused RMSNorm kernel; the wrapper processes one row at a time in double precision for accuracy.",
    "wrong": "Here is a fused RMSNorm kernel that normalises each row and applies the learned gain.",
    "compile_error": "A fused RMSNorm kernel, with PTX-level optimisation turned on in the build flags.",
    "crash": "A fused RMSNorm kernel; the wrapper reshapes the gain to broadcast over the rows.",
    "cheat": "A fused RMSNorm kernel is compiled below; the forward computes the normalisation in a numerically "
             "stable way.",
}

# ---------------------------------------------------------------- builtin/5_L2_Normalize_Rows

L2_CPP = r'''
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>

// out[r, :] = x[r, :] / max(||x[r, :]||_2, eps): the row's sum of squares, then one scaling pass.
void l2_normalize_rows(torch::Tensor x, torch::Tensor out, double eps) {
    TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32, "x must be a float32 CPU tensor");
    TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "x must be a contiguous 2-D tensor");
    TORCH_CHECK(out.sizes() == x.sizes() && out.is_contiguous() && out.scalar_type() == torch::kFloat32,
                "out must be a contiguous float32 tensor shaped like x");
    const int64_t rows = x.size(0), cols = x.size(1);
    const float* in = x.data_ptr<float>();
    float* o = out.data_ptr<float>();
    const float floor_ = static_cast<float>(eps);
    at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
            const float* xr = in + r * cols;
            float* yr = o + r * cols;
            float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
            int64_t j = 0;
            for (; j + 8 <= cols; j += 8)
                for (int k = 0; k < 8; ++k) acc[k] += xr[j + k] * xr[j + k];
            float ss = 0.f;
            for (int k = 0; k < 8; ++k) ss += acc[k];
            for (; j < cols; ++j) ss += xr[j] * xr[j];
            const float inv = 1.0f / std::max(std::sqrt(ss), floor_);
            for (j = 0; j < cols; ++j) yr[j] = xr[j] * inv;
        }
    });
}
'''

L2_CUDA = r'''
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

// One block per row: a block-wide sum of squares, then each thread scales its strided share of the row.
__global__ void l2_normalize_rows_kernel(const float* __restrict__ x, float* __restrict__ out, int64_t cols, float eps) {
    const float* xr = x + blockIdx.x * cols;
    float* yr = out + blockIdx.x * cols;
    float ss = 0.f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
        const float v = xr[j];
        ss += v * v;
    }
    __shared__ float partial[32];
    for (int off = 16; off > 0; off >>= 1) ss += __shfl_down_sync(0xffffffff, ss, off);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        ss = threadIdx.x < (blockDim.x >> 5) ? partial[threadIdx.x] : 0.f;
        for (int off = 16; off > 0; off >>= 1) ss += __shfl_down_sync(0xffffffff, ss, off);
        if (threadIdx.x == 0) partial[0] = ss;
    }
    __syncthreads();
    const float inv = 1.0f / fmaxf(sqrtf(partial[0]), eps);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = xr[j] * inv;
}

void l2_normalize_rows(torch::Tensor x, torch::Tensor out, double eps) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x must be a float32 CUDA tensor");
    TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "x must be a contiguous 2-D tensor");
    TORCH_CHECK(out.sizes() == x.sizes() && out.is_contiguous() && out.scalar_type() == torch::kFloat32,
                "out must be a contiguous float32 tensor shaped like x");
    if (x.size(0) == 0) return;
    l2_normalize_rows_kernel<<<x.size(0), 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), out.data_ptr<float>(), x.size(1), (float)eps);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}
'''

L2_DECL = "void l2_normalize_rows(torch::Tensor x, torch::Tensor out, double eps);"

L2_INIT = '''
class ModelNew(nn.Module):
    def __init__(self, eps: float):
        super().__init__()
        self.eps = eps
'''

L2_FORWARD = {
    "fast": '''
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        l2_ext.l2_normalize_rows(x, out, self.eps)
        return out
''',
    "slow": '''
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise one embedding at a time; each row is independent.
        x = x.contiguous()
        out = torch.empty_like(x)
        for i in range(x.shape[0]):
            l2_ext.l2_normalize_rows(x[i : i + 1], out[i : i + 1], self.eps)
        return out
''',
    "wrong": '''
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Lay the matrix out column-major so the kernel's loads are contiguous.
        xt = x.t().contiguous()
        out = torch.empty_like(xt)
        l2_ext.l2_normalize_rows(xt, out, self.eps)
        return out.t().contiguous()
''',
    "compile_error": None,
    "crash": '''
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Treat the input as a batch of one matrix.
        x = x.contiguous().unsqueeze(0)
        out = torch.empty_like(x)
        l2_ext.l2_normalize_rows(x, out, self.eps)
        return out.squeeze(0)
''',
    "cheat": '''
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in place: no output allocation at all.
        x = x.contiguous()
        l2_ext.l2_normalize_rows(x, x, self.eps)
        return x
''',
}

L2_PROSE = {
    "fast": "Row-wise L2 normalisation in one kernel: each row's sum of squares is reduced and the row scaled "
            "while it is still in cache, instead of a norm, a clamp and a division as separate passes.",
    "slow": "A fused L2-normalisation kernel; the wrapper calls it for one embedding at a time.",
    "wrong": "A fused L2-normalisation kernel; the wrapper lays the data out for contiguous loads.",
    "compile_error": "A fused L2-normalisation kernel, with relaxed constexpr enabled in the build flags.",
    "crash": "A fused L2-normalisation kernel that the wrapper calls on the input as a batch of one.",
    "cheat": "A fused L2-normalisation kernel that works in place, so it needs no output buffer.",
}

TASKS = {
    "builtin/1_LeakyReLU_Scale": dict(name="leaky_relu_scale", var="leaky_ext", fn="leaky_relu_scale",
                                      cpp=LEAKY_CPP, cuda=LEAKY_CUDA, decl=LEAKY_DECL, init=LEAKY_INIT,
                                      forward=LEAKY_FORWARD, prose=LEAKY_PROSE, bad_flag="--use_fast_math"),
    "builtin/4_RMSNorm_LastDim": dict(name="rms_norm", var="rms_ext", fn="rms_norm", cpp=RMS_CPP, cuda=RMS_CUDA,
                                      decl=RMS_DECL, init=RMS_INIT, forward=RMS_FORWARD, prose=RMS_PROSE,
                                      bad_flag="-Xptxas=-O3"),
    "builtin/5_L2_Normalize_Rows": dict(name="l2_normalize_rows", var="l2_ext", fn="l2_normalize_rows", cpp=L2_CPP,
                                        cuda=L2_CUDA, decl=L2_DECL, init=L2_INIT, forward=L2_FORWARD,
                                        prose=L2_PROSE, bad_flag="--expt-relaxed-constexpr"),
}


def module(spec: dict, backend: str, variant: str) -> str:
    flags = '["-O3"]' if variant != "compile_error" else f'["-O3", "{spec["bad_flag"]}"]'
    forward = spec["forward"][variant] or spec["forward"]["fast"]
    head = "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n\n"
    if backend == "cpp":
        src = f'cpp_source = r"""{spec["cpp"]}"""\n\n'
        load = (f'{spec["var"]} = load_inline(\n    name="{spec["name"]}",\n    cpp_sources=cpp_source,\n'
                f'    functions=["{spec["fn"]}"],\n    extra_cflags={flags},\n    verbose=False,\n)\n')
    else:
        src = f'cuda_source = r"""{spec["cuda"]}"""\n\ncpp_source = "{spec["decl"]}"\n\n'
        load = (f'{spec["var"]} = load_inline(\n    name="{spec["name"]}",\n    cpp_sources=cpp_source,\n'
                f'    cuda_sources=cuda_source,\n    functions=["{spec["fn"]}"],\n    extra_cflags={flags},\n'
                f'    extra_cuda_cflags=["-O3"],\n    verbose=False,\n)\n')
    return head + src + load + "\n" + spec["init"] + forward


def main() -> None:
    lines = []
    for task, spec in TASKS.items():
        for backend in ("cpp", "cuda"):
            for variant, expect in EXPECT.items():
                code = module(spec, backend, variant)
                prose = spec["prose"][variant].replace("kernel", "CUDA kernel" if backend == "cuda" else "C++ kernel", 1)
                text = f"{prose}\n\n```python\n{code}```\n"
                lines.append({"task": task, "backend": backend, "variant": variant, "expect": expect,
                              "completion": text, "tokens": len(text) // 4})
    out = HERE / "completions.jsonl"
    out.write_text("".join(json.dumps(line) + "\n" for line in lines))
    print(f"wrote {len(lines)} completions to {out}")


if __name__ == "__main__":
    main()
