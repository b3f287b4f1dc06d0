"""Level 1: numerically stable softmax over each row of a (rows, cols) matrix.
Tests a row-wise max and sum reduction followed by an elementwise pass, ideally fused into one kernel."""
import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Applies softmax along the last dimension (each row sums to 1).
    """
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Args:
            x (torch.Tensor): Input tensor of shape (num_rows, num_cols).

        Returns:
            torch.Tensor: Softmax probabilities, same shape as x.
        """
        return torch.softmax(x, dim=-1)


num_rows = 2048
num_cols = 2048


def get_inputs():
    # Scaled logits so that the max-subtraction step actually matters.
    x = torch.randn(num_rows, num_cols) * 4.0
    return [x]


def get_init_inputs():
    return []
