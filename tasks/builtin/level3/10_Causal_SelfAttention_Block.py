"""Level 3: a tiny multi-head causal self-attention block (QKV projection, masked softmax, output projection).
The attention core is the target for a fused, flash-attention-style kernel."""
import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Multi-head causal self-attention with the attention scores computed explicitly.
    """
    def __init__(self, embed_dim: int, num_heads: int, max_seq_len: int):
        super(Model, self).__init__()
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.proj = nn.Linear(embed_dim, embed_dim)
        mask = torch.tril(torch.ones(max_seq_len, max_seq_len, dtype=torch.bool))
        self.register_buffer("causal_mask", mask.view(1, 1, max_seq_len, max_seq_len))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, seq_len, embed_dim).

        Returns:
            torch.Tensor: Output tensor of the same shape as x.
        """
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-2, -1)) * (self.head_dim ** -0.5)
        scores = scores.masked_fill(~self.causal_mask[:, :, :t, :t], float("-inf"))
        attn = torch.softmax(scores, dim=-1)
        y = torch.matmul(attn, v)
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.proj(y)


batch_size = 8
seq_len = 256
embed_dim = 256
num_heads = 4


def get_inputs():
    x = torch.randn(batch_size, seq_len, embed_dim)
    return [x]


def get_init_inputs():
    return [embed_dim, num_heads, seq_len]
