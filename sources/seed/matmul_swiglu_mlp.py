"""SwiGLU feed-forward: down(silu(gate(x)) * up(x)).

Families: matmul, activation, elementwise. Level 3.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 2048
hidden = 2048
intermediate = 5632


class Model(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate = nn.Linear(hidden, intermediate, bias=False)
        self.up = nn.Linear(hidden, intermediate, bias=False)
        self.down = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


def get_inputs():
    return [torch.randn(batch_size, hidden)]


def get_init_inputs():
    return [hidden, intermediate]
