"""Running maximum along the last dimension (values only).

Families: scan. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 256
length = 32768


class Model(nn.Module):
    """Running maximum along the last dimension (values only)."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.cummax(x, dim=-1).values


def get_inputs():
    return [torch.randn(batch_size, length)]


def get_init_inputs():
    return []
