"""Hinge loss mean(clamp(1 - y * p, min=0)) with labels in {-1, 1}.

Families: loss. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 4096
dim = 4096


class Model(nn.Module):
    """Hinge loss mean(clamp(1 - y * p, min=0)) with labels in {-1, 1}."""

    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        return torch.clamp(1 - predictions * (2 * targets - 1), min=0).mean()


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randint(0, 2, (batch_size, dim)).float()]


def get_init_inputs():
    return []
