"""Pointwise (1x1) 2D convolution.

Families: conv. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 32
in_channels = 128
out_channels = 256
height = 64
width = 64


class Model(nn.Module):
    """Pointwise (1x1) 2D convolution."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=1)

    def forward(self, x):
        return self.conv(x)


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels]
