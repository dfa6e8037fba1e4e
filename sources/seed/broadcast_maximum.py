"""Elementwise maximum of a matrix and a column vector.

Families: broadcast. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 4096
dim = 8192


class Model(nn.Module):
    """Elementwise maximum of a matrix and a column vector."""

    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        return torch.maximum(x, y)


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(batch_size, 1)]


def get_init_inputs():
    return []
