"""Transposed 3D convolution with stride 2.

Families: conv_transpose. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 8
in_channels = 32
out_channels = 16
kernel_size = 3
depth = 16
height = 32
width = 32


class Model(nn.Module):
    """Transposed 3D convolution with stride 2."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.deconv = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=2)

    def forward(self, x):
        return self.deconv(x)


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
