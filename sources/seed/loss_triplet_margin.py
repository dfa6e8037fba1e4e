"""Triplet margin loss with margin 1.0.

Families: loss. Level 1.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 4096
dim = 4096


class Model(nn.Module):
    """Triplet margin loss with margin 1.0."""

    def __init__(self):
        super().__init__()

    def forward(self, anchor, positive, negative):
        return F.triplet_margin_loss(anchor, positive, negative, margin=1.0)


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(batch_size, dim), torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
