"""BatchNorm1d (inference statistics) over (N, C, L).

Families: norm. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 256
channels = 256
length = 1024


class Model(nn.Module):
    """BatchNorm1d (inference statistics) over (N, C, L)."""

    def __init__(self, channels: int):
        super().__init__()
        self.bn = nn.BatchNorm1d(channels)

    def forward(self, x):
        return self.bn(x)


def get_inputs():
    return [torch.randn(batch_size, channels, length)]


def get_init_inputs():
    return [channels]
