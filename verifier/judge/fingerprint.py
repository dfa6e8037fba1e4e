"""The keyed fingerprint a device's trial judge seals a paced trial's slot with at its "q"
(`verifier.judge.trial_judge`): what the slot must still hold at the check."""

from __future__ import annotations

from typing import Any


def fingerprint(data: Any, key: int, chunk: int) -> int:
    """A keyed hash of the bytes `data` (a uint8 tensor, on its device): the sum of each 32-bit
    word (a trailing byte on its own) times a weight in [0, 2^31) drawn from `key`, mod 2^64
    (int64 sums wrap). A change of the bytes leaves it unchanged with probability at most 2^-31
    for weights the worker does not know: a word changes by some 0 < |d| < 2^32, and d * w
    = c (mod 2^64) has at most one solution w under 2^31 (2^64 / gcd(d, 2^64) >= 2^33). Word by
    word (a quarter of the weights and a third of the memory traffic of byte by byte: each
    trial of a 6 GiB output is fingerprinted at its "q" and again at the check), in chunks of
    `chunk` words, two int64 temporaries each (within the comparison's); read once."""
    import torch

    gen = torch.Generator(device=data.device)
    gen.manual_seed(key)
    total = torch.zeros((), dtype=torch.int64, device=data.device)
    whole = data.numel() // 4 * 4
    pieces = [data[lo:min(lo + 4 * chunk, whole)] for lo in range(0, whole, 4 * chunk)]
    for piece in [*pieces, data[whole:]]:  # the words, then a trailing byte or three
        if piece.numel() % 4 == 0:  # (a slot off a word boundary: its chunk copied onto one)
            piece = (piece if piece.storage_offset() % 4 == 0 else piece.clone()).view(
                torch.int32)
        x = piece.to(torch.int64)
        weights = torch.randint(0, 1 << 31, x.shape, generator=gen, device=data.device,
                                dtype=torch.int64)
        total += x.mul_(weights).sum()
    return int(total)
