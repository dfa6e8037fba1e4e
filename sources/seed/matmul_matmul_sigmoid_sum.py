"""Linear, sigmoid, then a row sum.

Families: matmul, activation, reduction. Level 2.
"""

import torch
import torch.nn as nn

batch_size = 1024
in_features = 2048
out_features = 1024


class Model(nn.Module):
    """Linear, sigmoid, then a row sum."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.sigmoid(self.fc(x)).sum(dim=1, keepdim=True)


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
