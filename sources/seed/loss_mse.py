"""Mean squared error between predictions and targets.

Families: loss. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 4096
dim = 4096


class Model(nn.Module):
    """Mean squared error between predictions and targets."""

    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        return torch.mean((predictions - targets) ** 2)


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
