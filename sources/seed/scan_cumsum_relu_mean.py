"""Prefix sum, ReLU, then a row mean.

Families: scan, activation, reduction. Level 2.
"""

import torch
import torch.nn as nn

batch_size = 256
length = 32768


class Model(nn.Module):
    """Prefix sum, ReLU, then a row mean."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(torch.cumsum(x, dim=-1)).mean(dim=-1)


def get_inputs():
    return [torch.randn(batch_size, length)]


def get_init_inputs():
    return []
