"""Materialize the transpose of the last two dimensions.

Families: shape. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 64
rows = 1024
cols = 2048


class Model(nn.Module):
    """Materialize the transpose of the last two dimensions."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x.transpose(1, 2).contiguous()


def get_inputs():
    return [torch.randn(batch_size, rows, cols)]


def get_init_inputs():
    return []
