# builtin/1_LeakyReLU_Scale: plain PyTorch rewrite (accepted only with allow_torch)
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, negative_slope, scale):
        super().__init__()
        self.negative_slope = negative_slope
        self.scale = scale

    def forward(self, x):
        return torch.where(x >= 0, x, x * self.negative_slope) * self.scale
