"""HardSwish activation.

Families: activation. Level 1.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 4096
dim = 8192


class Model(nn.Module):
    """HardSwish activation."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return F.hardswish(x)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
