"""3D convolution with a cubic kernel.

Families: conv. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 8
in_channels = 16
out_channels = 32
kernel_size = 3
depth = 32
height = 64
width = 64


class Model(nn.Module):
    """3D convolution with a cubic kernel."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)

    def forward(self, x):
        return self.conv(x)


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
