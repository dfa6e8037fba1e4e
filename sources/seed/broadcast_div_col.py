"""Divide each row by a positive per-row scale.

Families: broadcast. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 4096
dim = 8192


class Model(nn.Module):
    """Divide each row by a positive per-row scale."""

    def __init__(self):
        super().__init__()

    def forward(self, x, s):
        return x / (s + 1.0)


def get_inputs():
    return [torch.randn(batch_size, dim), torch.rand(batch_size, 1)]


def get_init_inputs():
    return []
