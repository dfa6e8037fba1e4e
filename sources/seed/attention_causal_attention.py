"""Causal scaled dot-product attention with an upper-triangular mask.

Families: attention, matmul, softmax. Level 2.
"""

import math

import torch
import torch.nn as nn

batch_size = 16
heads = 16
seq_len = 1024
head_dim = 64


class Model(nn.Module):
    """Causal scaled dot-product attention with an upper-triangular mask."""

    def __init__(self):
        super().__init__()

    def forward(self, q, k, v):
        n = q.size(-2)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))
        mask = torch.triu(torch.ones(n, n, dtype=torch.bool, device=q.device), diagonal=1)
        scores = scores.masked_fill(mask, float("-inf"))
        return torch.matmul(torch.softmax(scores, dim=-1), v)


def get_inputs():
    return [torch.randn(batch_size, heads, seq_len, head_dim), torch.randn(batch_size, heads, seq_len, head_dim), torch.randn(batch_size, heads, seq_len, head_dim)]


def get_init_inputs():
    return []
