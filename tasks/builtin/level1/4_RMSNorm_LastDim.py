"""Level 1: RMS normalisation over the hidden dimension with a learned gain, as in LLaMA-style models.
One reduction per row (mean of squares) plus an elementwise rescale: a classic fused row kernel."""
import torch
import torch.nn as nn


class Model(nn.Module):
    """
    RMSNorm over the last dimension: y = x / sqrt(mean(x^2) + eps) * weight.
    """
    def __init__(self, hidden_size: int, eps: float):
        super(Model, self).__init__()
        self.eps = eps
        # Random gain (not ones) so that a kernel that ignores the weight is caught.
        self.weight = nn.Parameter(torch.rand(hidden_size) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, seq_len, hidden_size).

        Returns:
            torch.Tensor: Normalised tensor, same shape as x.
        """
        inv_rms = torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + self.eps)
        return x * inv_rms * self.weight


batch_size = 8
seq_len = 512
hidden_size = 1024
eps = 1e-6


def get_inputs():
    x = torch.randn(batch_size, seq_len, hidden_size)
    return [x]


def get_init_inputs():
    return [hidden_size, eps]
