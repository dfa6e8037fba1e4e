"""Suffix sum: cumulative sum from the end of each row.

Families: scan. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 256
length = 32768


class Model(nn.Module):
    """Suffix sum: cumulative sum from the end of each row."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.flip(torch.cumsum(torch.flip(x, dims=[-1]), dim=-1), dims=[-1])


def get_inputs():
    return [torch.randn(batch_size, length)]


def get_init_inputs():
    return []
