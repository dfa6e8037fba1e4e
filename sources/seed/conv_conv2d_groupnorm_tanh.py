"""Conv2d, GroupNorm, then tanh.

Families: conv, norm, activation. Level 2.
"""

import torch
import torch.nn as nn

batch_size = 32
in_channels = 32
out_channels = 64
groups = 8
height = 64
width = 64


class Model(nn.Module):
    """Conv2d, GroupNorm, then tanh."""

    def __init__(self, in_channels: int, out_channels: int, groups: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3)
        self.gn = nn.GroupNorm(groups, out_channels)

    def forward(self, x):
        return torch.tanh(self.gn(self.conv(x)))


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, groups]
