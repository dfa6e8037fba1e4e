"""Mean of 1 - cosine similarity over rows.

Families: loss, reduction. Level 2.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 4096
dim = 4096


class Model(nn.Module):
    """Mean of 1 - cosine similarity over rows."""

    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        return torch.mean(1 - F.cosine_similarity(predictions, targets, dim=1))


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
