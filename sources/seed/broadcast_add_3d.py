"""Add a (B, 1, N) tensor to a (1, M, N) tensor.

Families: broadcast. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 64
m_size = 512
n_size = 1024


class Model(nn.Module):
    """Add a (B, 1, N) tensor to a (1, M, N) tensor."""

    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return a + b


def get_inputs():
    return [torch.randn(batch_size, 1, n_size), torch.randn(1, m_size, n_size)]


def get_init_inputs():
    return []
