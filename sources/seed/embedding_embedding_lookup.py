"""Embedding table lookup of integer token ids.

Families: embedding. Level 1.
"""

import torch
import torch.nn as nn

batch_size = 64
seq_len = 2048
vocab_size = 32000
embed_dim = 1024


class Model(nn.Module):
    """Embedding table lookup of integer token ids."""

    def __init__(self, vocab_size: int, embed_dim: int):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embed_dim)

    def forward(self, ids):
        return self.embed(ids)


def get_inputs():
    return [torch.randint(0, vocab_size, (batch_size, seq_len))]


def get_init_inputs():
    return [vocab_size, embed_dim]
