"""Level 1: sum over the middle axis of a 3-D tensor (B, R, C) -> (B, C).
The reduced axis is strided, not contiguous, so a good kernel must keep loads coalesced along C."""
import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Sums a 3-D tensor over its middle dimension (dim=1), dropping that dimension.
    """
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, reduce_size, inner_size).

        Returns:
            torch.Tensor: Output tensor of shape (batch_size, inner_size).
        """
        return torch.sum(x, dim=1)


batch_size = 16
reduce_size = 512
inner_size = 512


def get_inputs():
    x = torch.randn(batch_size, reduce_size, inner_size)
    return [x]


def get_init_inputs():
    return []
