"""Square matrix multiplication C = A @ B.

Families: matmul. Level 1.
"""

import torch
import torch.nn as nn

n_size = 4096


class Model(nn.Module):
    """Square matrix multiplication C = A @ B."""

    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.matmul(a, b)


def get_inputs():
    return [torch.randn(n_size, n_size), torch.randn(n_size, n_size)]


def get_init_inputs():
    return []
