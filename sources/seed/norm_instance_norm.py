"""InstanceNorm2d without affine parameters.

Families: norm. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 32
channels = 64
height = 128
width = 128


class Model(nn.Module):
    """InstanceNorm2d without affine parameters."""

    def __init__(self, channels: int):
        super().__init__()
        self.inorm = nn.InstanceNorm2d(channels)

    def forward(self, x):
        return self.inorm(x)


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [channels]
