"""KL divergence between two softmax distributions (batchmean).

Families: loss. Level 2.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 4096
dim = 4096


class Model(nn.Module):
    """KL divergence between two softmax distributions (batchmean)."""

    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        return F.kl_div(torch.log_softmax(predictions, dim=-1), torch.softmax(targets, dim=-1), reduction="batchmean")


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
