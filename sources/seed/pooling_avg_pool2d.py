"""2D average pooling, kernel 2, stride 2.

Families: pooling. Level 1.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 32
channels = 64
height = 256
width = 256


class Model(nn.Module):
    """2D average pooling, kernel 2, stride 2."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return F.avg_pool2d(x, kernel_size=2, stride=2)


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return []
