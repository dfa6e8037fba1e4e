"""Linear layer followed by ReLU.

Families: matmul, activation. Level 2.
"""

import torch
import torch.nn as nn

batch_size = 1024
in_features = 4096
out_features = 4096


class Model(nn.Module):
    """Linear layer followed by ReLU."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.relu(self.fc(x))


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
