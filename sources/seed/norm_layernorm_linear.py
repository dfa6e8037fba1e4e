"""LayerNorm then a linear projection (pre-norm block input).

Families: norm, matmul. Level 2.
"""

import torch
import torch.nn as nn

batch_size = 2048
hidden = 2048
out_features = 2048


class Model(nn.Module):
    """LayerNorm then a linear projection (pre-norm block input)."""

    def __init__(self, hidden: int, out_features: int):
        super().__init__()
        self.ln = nn.LayerNorm(hidden)
        self.fc = nn.Linear(hidden, out_features)

    def forward(self, x):
        return self.fc(self.ln(x))


def get_inputs():
    return [torch.randn(batch_size, hidden)]


def get_init_inputs():
    return [hidden, out_features]
