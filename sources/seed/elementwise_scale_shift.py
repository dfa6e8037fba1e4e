"""Affine map of every element: x * alpha + beta.

Families: elementwise. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 4096
dim = 8192


class Model(nn.Module):
    """Affine map of every element: x * alpha + beta."""

    def __init__(self, alpha: float, beta: float):
        super().__init__()
        self.alpha = alpha
        self.beta = beta

    def forward(self, x):
        return x * self.alpha + self.beta


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [1.5, -0.25]
