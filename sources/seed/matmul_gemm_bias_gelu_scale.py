"""Matmul, extra bias add, GELU, then a constant scale.

Families: matmul, broadcast, activation. Level 2.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 1024
in_features = 2048
out_features = 2048


class Model(nn.Module):
    """Matmul, extra bias add, GELU, then a constant scale."""

    def __init__(self, in_features: int, out_features: int, scale: float):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(out_features, in_features) * 0.02)
        self.bias = nn.Parameter(torch.zeros(out_features))
        self.scale = scale

    def forward(self, x):
        x = torch.matmul(x, self.weight.T) + self.bias
        return F.gelu(x) * self.scale


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, 0.5]
