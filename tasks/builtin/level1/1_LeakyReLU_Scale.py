"""Level 1: LeakyReLU followed by a constant scale on a 4M-element tensor.
Purely elementwise and memory-bound: the baseline for vectorised loads and fusing two ops into one pass."""
import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Applies LeakyReLU with a fixed negative slope, then multiplies by a constant scale.
    """
    def __init__(self, negative_slope: float, scale: float):
        super(Model, self).__init__()
        self.negative_slope = negative_slope
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, dim).

        Returns:
            torch.Tensor: scale * leaky_relu(x), same shape as x.
        """
        x = torch.nn.functional.leaky_relu(x, negative_slope=self.negative_slope)
        return x * self.scale


batch_size = 4096
dim = 1024
negative_slope = 0.05
scale = 1.75


def get_inputs():
    x = torch.randn(batch_size, dim)
    return [x]


def get_init_inputs():
    return [negative_slope, scale]
