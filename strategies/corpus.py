"""A small local corpus of kernel patterns we wrote, for the agents' retrieval step.

Each pattern names the aten operators (as the profile reports them) and the words in task code that call
for it, a note on how to do it well, and a short fragment per backend. `retrieve` picks the patterns that
match a task's operators, best match first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Pattern:
    name: str
    ops: frozenset[str]  # aten operators (without "aten::") that call for this pattern
    words: tuple[str, ...]  # names in task code that do
    note: str
    code: dict[str, str] = field(default_factory=dict)  # backend -> fragment
    library: bool = False  # built around a library GEMM or convolution


ELEMENTWISE = Pattern(
    "elementwise", frozenset("relu leaky_relu gelu silu sigmoid tanh mul add sub div clamp clamp_min hardtanh exp "
                             "elu selu softplus mish hardswish hardsigmoid abs neg pow sqrt rsqrt where maximum minimum".split()),
    ("relu", "gelu", "silu", "sigmoid", "tanh", "leaky_relu", "clamp", "elu", "mish", "hardtanh", "* self.", "+ self."),
    "One thread per element (or 4 with float4 loads); fuse every elementwise step into one pass over memory.",
    {
        "cuda": r'''__global__ void fused_kernel(const float* __restrict__ x, float* __restrict__ y, float a, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) { float v = x[i]; v = v > 0.f ? v : v * a; y[i] = v * 2.0f; }  // all steps, one read, one write
}
// launch: fused_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), a, n);''',
        "triton": '''@triton.jit
def fused_kernel(x_ptr, y_ptr, a, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x_ptr + offs, mask=mask)
    v = tl.where(v > 0, v, v * a) * 2.0  # all steps, one read, one write
    tl.store(y_ptr + offs, v, mask=mask)''',
        "cpp": '''for (int64_t i = 0; i < n; ++i) { float v = xp[i]; v = v > 0.f ? v : v * a; yp[i] = v * 2.0f; }''',
    },
)

REDUCTION = Pattern(
    "reduction", frozenset("sum mean amax amin max min prod argmax argmin norm var std logsumexp".split()),
    ("sum(", "mean(", "max(", "min(", "prod(", "argmax", "argmin", "norm(", "var(", "std("),
    "One block per output row; each thread accumulates a strided slice, then a warp-shuffle tree, then shared memory.",
    {
        "cuda": r'''__global__ void row_sum(const float* x, float* out, int64_t cols) {
    const float* row = x + blockIdx.x * cols;
    float acc = 0.f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) acc += row[j];
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffff, acc, o);
    __shared__ float warp[32];
    if (threadIdx.x % 32 == 0) warp[threadIdx.x / 32] = acc;
    __syncthreads();
    if (threadIdx.x < 32) {
        acc = threadIdx.x < blockDim.x / 32 ? warp[threadIdx.x] : 0.f;
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffff, acc, o);
        if (threadIdx.x == 0) out[blockIdx.x] = acc;
    }
}''',
        "triton": '''@triton.jit
def row_sum(x_ptr, out_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + row * cols + offs, mask=offs < cols, other=0.0)
    tl.store(out_ptr + row, tl.sum(acc, axis=0))''',
        "cpp": '''for (int64_t r = 0; r < rows; ++r) { double acc = 0; for (int64_t j = 0; j < cols; ++j) acc += xp[r * cols + j]; op[r] = (float)acc; }''',
    },
)

SOFTMAX = Pattern(
    "softmax", frozenset("softmax _softmax log_softmax _log_softmax".split()),
    ("softmax",),
    "One block per row: max reduction, then sum of exp(x - max), then the normalised write; online softmax does it in two passes.",
    {
        "cuda": r'''// per row (one block): m = block_max(row); s = block_sum(expf(row[j] - m)); y[j] = expf(row[j] - m) / s;
__device__ float block_max(float v);  // warp shuffles + shared memory, as in a reduction
__device__ float block_sum(float v);''',
        "triton": '''@triton.jit
def softmax_row(x_ptr, y_ptr, cols, BLOCK: tl.constexpr):  # BLOCK >= cols
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * cols + offs, mask=offs < cols, other=-float("inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * cols + offs, e / tl.sum(e, axis=0), mask=offs < cols)''',
        "cpp": '''float m = -INFINITY; for (j...) m = std::max(m, row[j]); double s = 0; for (j...) s += std::exp(row[j] - m); for (j...) y[j] = std::exp(row[j] - m) / s;''',
    },
)

NORMALIZATION = Pattern(
    "normalization", frozenset("layer_norm native_layer_norm rms_norm _fused_rms_norm group_norm native_group_norm batch_norm "
                               "native_batch_norm _native_batch_norm_legit_no_training instance_norm".split()),
    ("layer_norm", "LayerNorm", "rms", "RMSNorm", "group_norm", "GroupNorm", "BatchNorm", "batch_norm", "normalize", "rsqrt"),
    "One block per row (or group): accumulate sum and sum of squares in one pass (Welford for stability), then normalise, scale and shift in the write.",
    {
        "cuda": r'''__global__ void rms_norm(const float* x, const float* w, float* y, int64_t cols, float eps) {
    const float* row = x + blockIdx.x * cols;
    float ss = 0.f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) ss += row[j] * row[j];
    ss = block_sum(ss);  // warp shuffles + shared memory
    float inv = rsqrtf(ss / cols + eps);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) y[blockIdx.x * cols + j] = row[j] * inv * w[j];
}''',
        "triton": '''@triton.jit
def rms_norm(x_ptr, w_ptr, y_ptr, cols, eps, BLOCK: tl.constexpr):  # BLOCK >= cols
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    m = offs < cols
    x = tl.load(x_ptr + row * cols + offs, mask=m, other=0.0)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / cols + eps)
    tl.store(y_ptr + row * cols + offs, x * inv * tl.load(w_ptr + offs, mask=m), mask=m)''',
        "cpp": '''double ss = 0; for (j...) ss += row[j] * row[j]; float inv = 1.f / std::sqrt(ss / cols + eps); for (j...) y[j] = row[j] * inv * w[j];''',
    },
)

GEMM_EPILOGUE = Pattern(
    "gemm_epilogue", frozenset("mm addmm bmm baddbmm matmul linear _addmm_activation".split()),
    ("nn.Linear", "matmul", "torch.mm", "torch.bmm", "@ "),
    "Keep the GEMM in cuBLAS (torch.matmul / F.linear without bias, or at::mm in C++), then one fused kernel for the "
    "epilogue: bias add, activation, scale, residual, all in one pass over the GEMM output.",
    {
        "cuda": r'''torch::Tensor forward(torch::Tensor x, torch::Tensor w, torch::Tensor b) {
    auto y = at::mm(x, w.t());  // library GEMM, no bias
    auto out = torch::empty_like(y);
    int64_t n = y.numel(), cols = y.size(1);
    bias_gelu<<<(n + 255) / 256, 256>>>(y.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), cols, n);
    return out;
}
__global__ void bias_gelu(const float* y, const float* b, float* out, int64_t cols, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) { float v = y[i] + b[i % cols]; out[i] = 0.5f * v * (1.f + erff(v * 0.70710678f)); }
}''',
        "triton": '''y = torch.matmul(x, self.linear.weight.t())  # library GEMM, no bias
@triton.jit
def bias_gelu(y_ptr, b_ptr, out_ptr, cols, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(y_ptr + offs, mask=m) + tl.load(b_ptr + offs % cols, mask=m)
    tl.store(out_ptr + offs, 0.5 * v * (1 + tl.erf(v * 0.70710678)), mask=m)''',
        "cpp": '''auto y = at::mm(x, w.t());  // library GEMM (MKL), then one loop: out[i] = act(y[i] + b[i % cols])''',
    },
    library=True,
)

CONV_EPILOGUE = Pattern(
    "conv_epilogue", frozenset("convolution _convolution conv1d conv2d conv3d cudnn_convolution mkldnn_convolution "
                               "conv_transpose1d conv_transpose2d conv_transpose3d".split()),
    ("nn.Conv", "conv2d", "conv1d", "conv3d", "ConvTranspose"),
    "Keep the convolution in cuDNN (F.conv2d, or at::conv2d in C++), then one fused kernel for the per-channel "
    "epilogue: index the channel as (i / (H*W)) % C for NCHW.",
    {
        "cuda": r'''auto y = at::conv2d(x, w, b, stride, padding);  // library convolution
__global__ void channel_bias_relu(const float* y, const float* cb, float* out, int64_t hw, int64_t c, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) { float v = y[i] + cb[(i / hw) % c]; out[i] = v > 0.f ? v : 0.f; }
}''',
        "triton": '''y = torch.nn.functional.conv2d(x, self.conv.weight, self.conv.bias)  # library convolution
@triton.jit
def channel_bias_relu(y_ptr, cb_ptr, out_ptr, hw, c, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(y_ptr + offs, mask=m) + tl.load(cb_ptr + (offs // hw) % c, mask=m)
    tl.store(out_ptr + offs, tl.maximum(v, 0.0), mask=m)''',
        "cpp": '''auto y = at::conv2d(x, w, b);  // library convolution (oneDNN), then out[i] = relu(y[i] + cb[(i / hw) % c])''',
    },
    library=True,
)

PATTERNS: tuple[Pattern, ...] = (ELEMENTWISE, REDUCTION, SOFTMAX, NORMALIZATION, GEMM_EPILOGUE, CONV_EPILOGUE)
BY_NAME = {p.name: p for p in PATTERNS}


def _bare(op: str) -> str:
    return op.split("::")[-1].split(".")[0].strip().lower()


def retrieve(ops: list[str], code: str = "", limit: int = 3) -> list[Pattern]:
    """Patterns for a task: those whose operators it calls (from the profile), then those named in its code."""
    names = {_bare(o) for o in ops}
    scored = []
    for i, p in enumerate(PATTERNS):
        by_op = len(names & {o.lower() for o in p.ops})
        by_word = sum(1 for w in p.words if re.search(re.escape(w), code))
        if by_op or by_word:
            scored.append((-(2 * by_op + by_word), i, p))
    scored.sort(key=lambda s: (s[0], s[1]))
    return [p for _, _, p in scored[:limit]]


def render(patterns: list[Pattern], backend: str) -> str:
    """The retrieved patterns as prompt text."""
    if not patterns:
        return ""
    lang = "cpp" if backend in ("cuda", "cpp") else "python"
    blocks = [f"### {p.name}\n{p.note}\n```{lang}\n{p.code.get(backend, p.code['cuda'])}\n```" for p in patterns]
    return "Patterns from our corpus that fit this task's operators:\n\n" + "\n\n".join(blocks)
