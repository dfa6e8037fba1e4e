"""ReLU6 activation.

Families: activation. Level 1.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 4096
dim = 8192


class Model(nn.Module):
    """ReLU6 activation."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return F.relu6(x)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
