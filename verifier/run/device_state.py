"""The persistent worker's device: whether its CUDA context still works, and which device it
got (`verifier.run.gpu_worker`)."""

from __future__ import annotations

import os
from typing import Any


def sticky_cuda_error() -> str | None:
    """The error a broken CUDA context raises, or None when it still works."""
    import torch

    try:
        torch.cuda.synchronize()
        torch.zeros(1, device="cuda").add_(1).item()
        return None
    except Exception as exc:  # the context is broken; this worker must not run more candidates
        return f"{type(exc).__name__}: {exc}"[:500]


def device_ident(backend: Any) -> str:
    """Which physical device this worker got: its pinning variable and the device's UUID."""
    import torch

    var = getattr(backend, "visible_devices_env", "")
    if not var:
        return backend.device()
    props = getattr(torch, backend.device()).get_device_properties(0)
    pinned = f"{backend.device()}[{var}={os.environ.get(var, '')}]"
    return f"{pinned} {getattr(props, 'uuid', '')}".rstrip()
