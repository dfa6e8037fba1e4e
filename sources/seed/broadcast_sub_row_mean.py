"""Center each row by subtracting its mean.

Families: broadcast, reduction. Level 2.
"""

import torch
import torch.nn as nn

batch_size = 4096
dim = 8192


class Model(nn.Module):
    """Center each row by subtracting its mean."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x - x.mean(dim=1, keepdim=True)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
