"""How the verifier draws a task's inputs: seeded, on the device, and on odd seeds signed.

Every KernelBench problem file draws its inputs with `torch.rand`, uniform on [0, 1). A kernel
that is right only for non-negative inputs (a ReLU that copies its input, a SELU without its
negative branch, an abs that returns x) passes every trial drawn that way, and KernelBench's
own harness calls it correct. On an odd seed, `torch.rand` and `torch.rand_like` draw from
[-0.5, 1) instead while `get_inputs` runs (a third of the values negative), so such a kernel is
`incorrect`. The draw keeps a positive mean: sums and dot products of inputs stay far from zero
as the task's own draws put them (on a zero-mean draw, the results of an honest fp32 matmul with
K = 2^19 sit near zero, where its rounding error exceeds atol: measured on an H200). The parent picks the
input seed so that the first trial is a signed one (`trial_input_seed`); with two trials or
more both kinds run. A reference value that is not finite on a signed draw (a log or a square
root of a negative) matches only the same non-finite value (`verifier.judge.device_compare`), so a
kernel that follows torch's own math passes there too.

Every process that draws inputs (the worker, the parent's recheck, the referee, the window
judge, the generalisation variants) draws them here, so all of them see the same tensors.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
from collections.abc import Iterator
from typing import Any

from verifier.judge.tensors import to_device

_PATCH = threading.RLock()  # torch.rand is patched module-wide: one draw at a time


def signed_seed(seed: int) -> bool:
    """Whether inputs drawn under `seed` are signed (uniform draws on [-0.5, 1))."""
    return seed % 2 == 1


def trial_input_seed() -> int:
    """A fresh input seed whose first trial (seed + 1000) is a signed draw."""
    return secrets.randbelow(1 << 29) * 2 + 1


@contextlib.contextmanager
def _signed_uniform() -> Iterator[None]:
    import torch

    rand, rand_like = torch.rand, torch.rand_like

    def signed(draw: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            grad = kwargs.pop("requires_grad", False)
            out = draw(*args, **kwargs).mul_(1.5).sub_(0.5)
            return out.requires_grad_(True) if grad else out
        return wrapped

    torch.rand, torch.rand_like = signed(rand), signed(rand_like)
    try:
        yield
    finally:
        torch.rand, torch.rand_like = rand, rand_like


def draw_inputs(get_inputs: Any, seed: int, device: str) -> list[Any]:
    """The task's inputs under `seed`, made on `device` (fast for big tensors); signed on an odd
    seed."""
    import torch

    with _PATCH:
        torch.manual_seed(seed)
        with _signed_uniform() if signed_seed(seed) else contextlib.nullcontext():
            if device == "cpu":
                return list(to_device(get_inputs(), device))
            with torch.device(device):
                return list(to_device(get_inputs(), device))
