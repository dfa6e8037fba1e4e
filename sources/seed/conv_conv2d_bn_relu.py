"""Conv2d, BatchNorm2d and ReLU (the ResNet stem).

Families: conv, norm, activation. Level 2.
"""

import torch
import torch.nn as nn

batch_size = 32
in_channels = 64
out_channels = 64
height = 128
width = 128


class Model(nn.Module):
    """Conv2d, BatchNorm2d and ReLU (the ResNet stem)."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(out_channels)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels]
