"""BatchNorm2d (inference statistics) over an NCHW tensor.

Families: norm. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 64
channels = 64
height = 128
width = 128


class Model(nn.Module):
    """BatchNorm2d (inference statistics) over an NCHW tensor."""

    def __init__(self, channels: int):
        super().__init__()
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x):
        return self.bn(x)


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [channels]
