"""Row softmax then a matmul with a value matrix.

Families: softmax, matmul. Level 2.
"""

import torch
import torch.nn as nn

batch_size = 2048
k_size = 2048
n_size = 1024


class Model(nn.Module):
    """Row softmax then a matmul with a value matrix."""

    def __init__(self):
        super().__init__()

    def forward(self, scores, values):
        return torch.matmul(torch.softmax(scores, dim=-1), values)


def get_inputs():
    return [torch.randn(batch_size, k_size), torch.randn(k_size, n_size)]


def get_init_inputs():
    return []
