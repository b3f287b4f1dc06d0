"""Level 3: a pre-norm transformer MLP block, y = x + fc2(gelu(fc1(layernorm(x)))).
Combines a normalisation, two GEMMs with fused epilogues and a residual add in one small block."""
import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Transformer feed-forward sub-block with LayerNorm in front and a residual connection around it.
    """
    def __init__(self, hidden_size: int, ffn_size: int):
        super(Model, self).__init__()
        self.norm = nn.LayerNorm(hidden_size)
        self.fc1 = nn.Linear(hidden_size, ffn_size)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(ffn_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, seq_len, hidden_size).

        Returns:
            torch.Tensor: Output tensor of the same shape as x.
        """
        h = self.norm(x)
        h = self.fc1(h)
        h = self.act(h)
        h = self.fc2(h)
        return x + h


batch_size = 4
seq_len = 256
hidden_size = 512
ffn_size = 1024


def get_inputs():
    x = torch.randn(batch_size, seq_len, hidden_size)
    return [x]


def get_init_inputs():
    return [hidden_size, ffn_size]
