"""Depthwise 2D convolution (groups = channels).

Families: conv. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 32
channels = 128
kernel_size = 3
height = 128
width = 128


class Model(nn.Module):
    """Depthwise 2D convolution (groups = channels)."""

    def __init__(self, channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size, padding=1, groups=channels)

    def forward(self, x):
        return self.conv(x)


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [channels, kernel_size]
