"""Elementwise square root of non-negative values.

Families: elementwise. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 4096
dim = 8192


class Model(nn.Module):
    """Elementwise square root of non-negative values."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.sqrt(x)


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return []
