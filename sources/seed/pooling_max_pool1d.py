"""1D max pooling, kernel 4, stride 2.

Families: pooling. Level 1.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 64
channels = 64
length = 8192


class Model(nn.Module):
    """1D max pooling, kernel 4, stride 2."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return F.max_pool1d(x, kernel_size=4, stride=2)


def get_inputs():
    return [torch.randn(batch_size, channels, length)]


def get_init_inputs():
    return []
