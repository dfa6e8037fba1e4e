"""Keep elements above a threshold, zero the rest.

Families: elementwise. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 4096
dim = 8192


class Model(nn.Module):
    """Keep elements above a threshold, zero the rest."""

    def __init__(self, threshold: float):
        super().__init__()
        self.threshold = threshold

    def forward(self, x):
        return torch.where(x > self.threshold, x, torch.zeros_like(x))


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [0.1]
