"""3D max pooling, kernel 2, stride 2.

Families: pooling. Level 1.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 8
channels = 32
depth = 32
height = 64
width = 64


class Model(nn.Module):
    """3D max pooling, kernel 2, stride 2."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return F.max_pool3d(x, kernel_size=2, stride=2)


def get_inputs():
    return [torch.randn(batch_size, channels, depth, height, width)]


def get_init_inputs():
    return []
