"""Matrix multiplication with the first operand transposed.

Families: matmul. Level 1.
"""

import torch
import torch.nn as nn

m_size = 2048
k_size = 4096
n_size = 2048


class Model(nn.Module):
    """Matrix multiplication with the first operand transposed."""

    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.matmul(a.T, b)


def get_inputs():
    return [torch.randn(k_size, m_size), torch.randn(k_size, n_size)]


def get_init_inputs():
    return []
