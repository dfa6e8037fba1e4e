"""Add a learned row vector to every row of a matrix.

Families: broadcast. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 4096
dim = 8192


class Model(nn.Module):
    """Add a learned row vector to every row of a matrix."""

    def __init__(self, dim: int):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(dim))

    def forward(self, x):
        return x + self.bias


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim]
