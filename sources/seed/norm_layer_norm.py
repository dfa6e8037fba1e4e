"""LayerNorm over the last dimension with affine parameters.

Families: norm. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 4096
hidden = 4096


class Model(nn.Module):
    """LayerNorm over the last dimension with affine parameters."""

    def __init__(self, hidden: int):
        super().__init__()
        self.ln = nn.LayerNorm(hidden)

    def forward(self, x):
        return self.ln(x)


def get_inputs():
    return [torch.randn(batch_size, hidden)]


def get_init_inputs():
    return [hidden]
