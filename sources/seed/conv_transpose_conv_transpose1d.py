"""Transposed 1D convolution with stride 2.

Families: conv_transpose. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 32
in_channels = 64
out_channels = 32
kernel_size = 4
length = 2048


class Model(nn.Module):
    """Transposed 1D convolution with stride 2."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.deconv = nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride=2)

    def forward(self, x):
        return self.deconv(x)


def get_inputs():
    return [torch.randn(batch_size, in_channels, length)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
