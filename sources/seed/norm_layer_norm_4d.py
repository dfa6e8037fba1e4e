"""LayerNorm over the last three dimensions of a 4D tensor.

Families: norm. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 16
features = 64
dim1 = 256
dim2 = 256


class Model(nn.Module):
    """LayerNorm over the last three dimensions of a 4D tensor."""

    def __init__(self, features: int, dim1: int, dim2: int):
        super().__init__()
        self.ln = nn.LayerNorm((features, dim1, dim2))

    def forward(self, x):
        return self.ln(x)


def get_inputs():
    return [torch.randn(batch_size, features, dim1, dim2)]


def get_init_inputs():
    return [features, dim1, dim2]
