# expect: correct - tries to chown a file it made to another uid and reads its own CapEff; raises (runtime_error) if either shows a capability, which the worker's capability drop (or running as non-root) prevents
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP = r"""
#include <torch/extension.h>

torch::Tensor leaky_scale(torch::Tensor x, double slope, double scale) {
    TORCH_CHECK(x.is_contiguous() && x.scalar_type() == torch::kFloat32, "x must be contiguous float32");
    auto y = torch::empty_like(x);
    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    const float s = static_cast<float>(slope), k = static_cast<float>(scale);
    const int64_t n = x.numel();
    for (int64_t i = 0; i < n; ++i) {
        const float v = xp[i];
        yp[i] = (v >= 0.0f ? v : v * s) * k;
    }
    return y;
}
"""

ext = load_inline(name="leaky_scale", cpp_sources=CPP, functions=["leaky_scale"])


class ModelNew(nn.Module):
    def __init__(self, negative_slope, scale):
        super().__init__()
        self.negative_slope = negative_slope
        self.scale = scale

    def kernel(self, x):
        return ext.leaky_scale(x.contiguous(), self.negative_slope, self.scale)

    def forward(self, x):
        import os
        powers = []
        # Giving a file away to another user needs CAP_CHOWN, which root has unless it was dropped.
        path = "root_powers_probe.txt"
        with open(path, "w") as f:
            f.write("probe")
        try:
            os.chown(path, 65534, 65534)
            powers.append("chown to uid 65534")
        except OSError:
            pass
        os.remove(path)
        status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
        if int(status.get("CapEff", "0").strip(), 16):
            powers.append("CapEff " + status["CapEff"].strip())
        if powers:
            raise RuntimeError("the worker holds root powers: %s" % ", ".join(powers))
        return self.kernel(x)
