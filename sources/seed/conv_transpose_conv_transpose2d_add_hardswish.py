"""Transposed conv2d, add a tensor, then HardSwish.

Families: conv_transpose, elementwise, activation. Level 2.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 16
in_channels = 32
out_channels = 64
height = 32
width = 32


class Model(nn.Module):
    """Transposed conv2d, add a tensor, then HardSwish."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.deconv = nn.ConvTranspose2d(in_channels, out_channels, 4, stride=2, padding=1)

    def forward(self, x, add_input):
        return F.hardswish(self.deconv(x) + add_input)


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width), torch.randn(batch_size, out_channels, 2 * height, 2 * width)]


def get_init_inputs():
    return [in_channels, out_channels]
