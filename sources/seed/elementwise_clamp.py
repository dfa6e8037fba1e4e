"""Clamp every element into [min_value, max_value].

Families: elementwise. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 4096
dim = 8192


class Model(nn.Module):
    """Clamp every element into [min_value, max_value]."""

    def __init__(self, min_value: float, max_value: float):
        super().__init__()
        self.min_value = min_value
        self.max_value = max_value

    def forward(self, x):
        return torch.clamp(x, self.min_value, self.max_value)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [-0.5, 0.5]
