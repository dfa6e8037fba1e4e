"""Bias add, GELU, then residual add (a transformer MLP epilogue).

Families: broadcast, activation, elementwise. Level 2.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 4096
dim = 8192


class Model(nn.Module):
    """Bias add, GELU, then residual add (a transformer MLP epilogue)."""

    def __init__(self, dim: int):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(dim) * 0.1)

    def forward(self, x, residual):
        return F.gelu(x + self.bias) + residual


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim]
