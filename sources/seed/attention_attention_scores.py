"""Attention logits Q K^T scaled by 1/sqrt(d).

Families: attention, matmul. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 16
heads = 16
seq_len = 1024
head_dim = 64


class Model(nn.Module):
    """Attention logits Q K^T scaled by 1/sqrt(d)."""

    def __init__(self):
        super().__init__()

    def forward(self, q, k):
        return torch.matmul(q, k.transpose(-2, -1)) * (q.size(-1) ** -0.5)


def get_inputs():
    return [torch.randn(batch_size, heads, seq_len, head_dim), torch.randn(batch_size, heads, seq_len, head_dim)]


def get_init_inputs():
    return []
