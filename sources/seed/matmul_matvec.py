"""Matrix-vector product (M, K) @ (K, 1).

Families: matmul. Level 1.
"""

import torch
import torch.nn as nn

m_size = 8192
k_size = 8192


class Model(nn.Module):
    """Matrix-vector product (M, K) @ (K, 1)."""

    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.matmul(a, b)


def get_inputs():
    return [torch.randn(m_size, k_size), torch.randn(k_size, 1)]


def get_init_inputs():
    return []
