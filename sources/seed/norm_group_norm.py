"""GroupNorm over an NCHW tensor.

Families: norm. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 32
channels = 64
groups = 8
height = 128
width = 128


class Model(nn.Module):
    """GroupNorm over an NCHW tensor."""

    def __init__(self, groups: int, channels: int):
        super().__init__()
        self.gn = nn.GroupNorm(groups, channels)

    def forward(self, x):
        return self.gn(x)


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [groups, channels]
