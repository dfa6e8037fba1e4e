"""Linear, LayerNorm, SiLU, then a learned per-feature scale (4-op chain).

Families: matmul, norm, activation, elementwise. Level 2.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 1024
in_features = 2048
out_features = 2048


class Model(nn.Module):
    """Linear, LayerNorm, SiLU, then a learned per-feature scale (4-op chain)."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)
        self.ln = nn.LayerNorm(out_features)
        self.scale = nn.Parameter(torch.ones(out_features) * 0.5)

    def forward(self, x):
        return F.silu(self.ln(self.fc(x))) * self.scale


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
