"""Conv3d, ReLU, 2x average pooling, sigmoid.

Families: conv, activation, pooling. Level 2.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 8
in_channels = 8
out_channels = 16
depth = 16
height = 64
width = 64


class Model(nn.Module):
    """Conv3d, ReLU, 2x average pooling, sigmoid."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, 3, padding=1)

    def forward(self, x):
        return torch.sigmoid(F.avg_pool3d(torch.relu(self.conv(x)), 2))


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels]
