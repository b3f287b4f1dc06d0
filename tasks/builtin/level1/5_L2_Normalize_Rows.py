"""Level 1: scale every row of a matrix to unit L2 norm (with an eps floor), as used for embeddings.
A row reduction whose result feeds a division over the same row: tests keeping the row on-chip."""
import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Row-wise L2 normalisation: y = x / max(||x||_2, eps), norm taken over the last dimension.
    """
    def __init__(self, eps: float):
        super(Model, self).__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Args:
            x (torch.Tensor): Input tensor of shape (num_rows, embed_dim).

        Returns:
            torch.Tensor: Tensor of the same shape whose rows have unit L2 norm.
        """
        norm = torch.linalg.vector_norm(x, ord=2, dim=-1, keepdim=True)
        return x / torch.clamp(norm, min=self.eps)


num_rows = 8192
embed_dim = 512
eps = 1e-12


def get_inputs():
    x = torch.randn(num_rows, embed_dim)
    return [x]


def get_init_inputs():
    return [eps]
