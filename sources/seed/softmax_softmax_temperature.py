"""Softmax of logits divided by a temperature.

Families: softmax, elementwise. Level 2.
"""

import torch
import torch.nn as nn

batch_size = 4096
dim = 8192


class Model(nn.Module):
    """Softmax of logits divided by a temperature."""

    def __init__(self, temperature: float):
        super().__init__()
        self.temperature = temperature

    def forward(self, x):
        return torch.softmax(x / self.temperature, dim=-1)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [0.7]
