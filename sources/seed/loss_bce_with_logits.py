"""Binary cross-entropy on logits.

Families: loss. Level 1.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 4096
dim = 4096


class Model(nn.Module):
    """Binary cross-entropy on logits."""

    def __init__(self):
        super().__init__()

    def forward(self, logits, targets):
        return F.binary_cross_entropy_with_logits(logits, targets)


def get_inputs():
    return [torch.randn(batch_size, dim), torch.rand(batch_size, dim)]


def get_init_inputs():
    return []
