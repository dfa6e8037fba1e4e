"""Inclusive prefix product of values close to one.

Families: scan. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 256
length = 32768


class Model(nn.Module):
    """Inclusive prefix product of values close to one."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.cumprod(1.0 + 0.001 * x, dim=-1)


def get_inputs():
    return [torch.randn(batch_size, length)]


def get_init_inputs():
    return []
