"""Batched matrix multiplication.

Families: matmul. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 128
m_size = 512
k_size = 1024
n_size = 512


class Model(nn.Module):
    """Batched matrix multiplication."""

    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.bmm(a, b)


def get_inputs():
    return [torch.randn(batch_size, m_size, k_size), torch.randn(batch_size, k_size, n_size)]


def get_init_inputs():
    return []
