"""2D max pooling, kernel 3, stride 2, padding 1.

Families: pooling. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 32
channels = 64
height = 256
width = 256


class Model(nn.Module):
    """2D max pooling, kernel 3, stride 2, padding 1."""

    def __init__(self):
        super().__init__()
        self.pool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)

    def forward(self, x):
        return self.pool(x)


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return []
