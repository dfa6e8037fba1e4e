"""2D convolution with a square kernel and padding 1.

Families: conv. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 32
in_channels = 64
out_channels = 128
kernel_size = 3
height = 128
width = 128


class Model(nn.Module):
    """2D convolution with a square kernel and padding 1."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=1)

    def forward(self, x):
        return self.conv(x)


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
