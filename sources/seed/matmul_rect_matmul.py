"""Rectangular matrix multiplication (M, K) @ (K, N).

Families: matmul. Level 1.
"""

import torch
import torch.nn as nn

m_size = 2048
k_size = 8192
n_size = 1024


class Model(nn.Module):
    """Rectangular matrix multiplication (M, K) @ (K, N)."""

    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.matmul(a, b)


def get_inputs():
    return [torch.randn(m_size, k_size), torch.randn(k_size, n_size)]


def get_init_inputs():
    return []
