"""Apply rotary position embeddings (rotate-half form) to a query tensor.

Families: attention, elementwise. Level 2.
"""

import torch
import torch.nn as nn

batch_size = 16
heads = 32
seq_len = 2048
head_dim = 128


class Model(nn.Module):
    """Apply rotary position embeddings (rotate-half form) to a query tensor."""

    def __init__(self):
        super().__init__()

    def forward(self, x, cos, sin):
        half = x.size(-1) // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin


def get_inputs():
    return [torch.randn(batch_size, heads, seq_len, head_dim), torch.randn(seq_len, head_dim), torch.randn(seq_len, head_dim)]


def get_init_inputs():
    return []
