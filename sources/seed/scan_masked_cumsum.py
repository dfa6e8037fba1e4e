"""Prefix sum over the elements selected by a mask.

Families: scan, elementwise. Level 2.
"""

import torch
import torch.nn as nn

batch_size = 256
length = 32768


class Model(nn.Module):
    """Prefix sum over the elements selected by a mask."""

    def __init__(self):
        super().__init__()

    def forward(self, x, mask):
        return torch.cumsum(x * mask, dim=-1)


def get_inputs():
    return [torch.randn(batch_size, length), torch.randint(0, 2, (batch_size, length)).bool()]


def get_init_inputs():
    return []
