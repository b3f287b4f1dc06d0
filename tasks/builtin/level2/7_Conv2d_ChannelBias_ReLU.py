"""Level 2: a padded 3x3 Conv2d (no built-in bias), a separate per-channel bias add, then ReLU.
The broadcast bias and activation can be fused into the convolution's output write."""
import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Applies a 3x3 convolution with padding 1, adds a learned per-output-channel bias and applies ReLU.
    """
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super(Model, self).__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size,
                              padding=kernel_size // 2, bias=False)
        self.bias = nn.Parameter(torch.randn(out_channels, 1, 1) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, in_channels, height, width).

        Returns:
            torch.Tensor: Output tensor of shape (batch_size, out_channels, height, width).
        """
        x = self.conv(x)
        x = x + self.bias
        return torch.relu(x)


batch_size = 16
in_channels = 16
out_channels = 32
height = 64
width = 64
kernel_size = 3


def get_inputs():
    x = torch.randn(batch_size, in_channels, height, width)
    return [x]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
