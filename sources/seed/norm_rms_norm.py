"""RMSNorm over the last dimension with a learned weight.

Families: norm. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 4096
hidden = 4096


class Model(nn.Module):
    """RMSNorm over the last dimension with a learned weight."""

    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x):
        variance = x.pow(2).mean(dim=-1, keepdim=True)
        return x * torch.rsqrt(variance + self.eps) * self.weight


def get_inputs():
    return [torch.randn(batch_size, hidden)]


def get_init_inputs():
    return [hidden, 1e-6]
