"""Sum over one dimension, keeping it.

Families: reduction. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 128
dim1 = 4096
dim2 = 4095


class Model(nn.Module):
    """Sum over one dimension, keeping it."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.sum(x, dim=self.dim, keepdim=True)


def get_inputs():
    return [torch.randn(batch_size, dim1, dim2)]


def get_init_inputs():
    return [1]
