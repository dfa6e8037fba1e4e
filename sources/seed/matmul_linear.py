"""Fully connected layer y = x W^T + b.

Families: matmul. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 1024
in_features = 4096
out_features = 4096


class Model(nn.Module):
    """Fully connected layer y = x W^T + b."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)

    def forward(self, x):
        return self.fc(x)


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
