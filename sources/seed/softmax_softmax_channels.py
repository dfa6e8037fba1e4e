"""Softmax over the channel dimension of an NCHW tensor.

Families: softmax. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 32
channels = 256
height = 64
width = 64


class Model(nn.Module):
    """Softmax over the channel dimension of an NCHW tensor."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return []
