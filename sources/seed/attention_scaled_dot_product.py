"""Scaled dot-product attention written out: softmax(Q K^T / sqrt(d)) V.

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
    """Scaled dot-product attention written out: softmax(Q K^T / sqrt(d)) V."""

    def __init__(self):
        super().__init__()

    def forward(self, q, k, v):
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))
        return torch.matmul(torch.softmax(scores, dim=-1), v)


def get_inputs():
    return [torch.randn(batch_size, heads, seq_len, head_dim), torch.randn(batch_size, heads, seq_len, head_dim), torch.randn(batch_size, heads, seq_len, head_dim)]


def get_init_inputs():
    return []
