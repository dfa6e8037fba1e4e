"""Scale each channel of an NCHW tensor by a learned factor.

Families: broadcast. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 64
channels = 64
height = 128
width = 128


class Model(nn.Module):
    """Scale each channel of an NCHW tensor by a learned factor."""

    def __init__(self, channels: int):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(channels))

    def forward(self, x):
        return x * self.scale.view(1, -1, 1, 1)


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [channels]
