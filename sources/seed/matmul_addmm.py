"""bias + A @ B with a broadcast bias row.

Families: matmul, broadcast. Level 2.
"""

import torch
import torch.nn as nn

m_size = 2048
k_size = 2048
n_size = 2048


class Model(nn.Module):
    """bias + A @ B with a broadcast bias row."""

    def __init__(self):
        super().__init__()

    def forward(self, bias, a, b):
        return torch.addmm(bias, a, b)


def get_inputs():
    return [torch.randn(n_size), torch.randn(m_size, k_size), torch.randn(k_size, n_size)]


def get_init_inputs():
    return []
