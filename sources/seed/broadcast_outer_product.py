"""Outer product of two vectors by broadcasting.

Families: broadcast. Level 1.
"""

import torch
import torch.nn as nn

m_size = 8192
n_size = 8192


class Model(nn.Module):
    """Outer product of two vectors by broadcasting."""

    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return a.unsqueeze(1) * b.unsqueeze(0)


def get_inputs():
    return [torch.randn(m_size), torch.randn(n_size)]


def get_init_inputs():
    return []
