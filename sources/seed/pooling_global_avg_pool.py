"""Global average pooling of an NCHW tensor to (N, C).

Families: pooling, reduction. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 64
channels = 512
height = 32
width = 32


class Model(nn.Module):
    """Global average pooling of an NCHW tensor to (N, C)."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x.mean(dim=(2, 3))


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return []
