"""Batched 4D matrix multiplication (B, H, M, K) @ (B, H, K, N).

Families: matmul. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 16
heads = 16
m_size = 256
k_size = 128
n_size = 256


class Model(nn.Module):
    """Batched 4D matrix multiplication (B, H, M, K) @ (B, H, K, N)."""

    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.matmul(a, b)


def get_inputs():
    return [torch.randn(batch_size, heads, m_size, k_size), torch.randn(batch_size, heads, k_size, n_size)]


def get_init_inputs():
    return []
