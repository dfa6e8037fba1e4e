"""HardTanh activation clipped to [-1, 1].

Families: activation. Level 1.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 4096
dim = 8192


class Model(nn.Module):
    """HardTanh activation clipped to [-1, 1]."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return F.hardtanh(x, min_val=-1.0, max_val=1.0)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
