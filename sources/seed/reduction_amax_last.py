"""Maximum over the last dimension of a 4D tensor.

Families: reduction. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 32
channels = 64
height = 256
width = 256


class Model(nn.Module):
    """Maximum over the last dimension of a 4D tensor."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.amax(x, dim=-1)


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return []
