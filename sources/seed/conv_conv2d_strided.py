"""2D convolution with stride 2 and no bias.

Families: conv. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 32
in_channels = 32
out_channels = 64
kernel_size = 5
height = 256
width = 256


class Model(nn.Module):
    """2D convolution with stride 2 and no bias."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=2, bias=False)

    def forward(self, x):
        return self.conv(x)


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
