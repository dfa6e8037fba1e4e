"""Smooth L1 (Huber) loss.

Families: loss. Level 1.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 4096
dim = 4096


class Model(nn.Module):
    """Smooth L1 (Huber) loss."""

    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        return F.smooth_l1_loss(predictions, targets)


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
