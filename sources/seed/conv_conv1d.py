"""1D convolution, stride 1, no padding.

Families: conv. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 64
in_channels = 64
out_channels = 128
kernel_size = 3
length = 4096


class Model(nn.Module):
    """1D convolution, stride 1, no padding."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size)

    def forward(self, x):
        return self.conv(x)


def get_inputs():
    return [torch.randn(batch_size, in_channels, length)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
