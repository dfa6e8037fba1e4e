"""How every process builds a task's `Model` and a candidate's `ModelNew`: the one rule.

A KernelBench level-3 model holds GBs of weights (level3/2_ShallowWideMLP: 8.6 GB of fp32),
and `nn.Linear`'s init runs on one host core (~1.3 s per 1.3e8 weights), so building it on the
host and then moving it (`Model(*init).to(device)`, KernelBench's way) costs 8-20 s per model.
Built under `with torch.device(device):` its weights are made and initialised on the device
itself. `torch.manual_seed` seeds every device's generator, so the same seed and the same
construction method (the same draws, in the same order, on the same kind of device) give the
same weights in every process: the worker's reference and candidate, the trusted judge's
reference (`verifier.judge.decide.reference`, the referee, the window judge), the
generalisation variants. On the cpu both methods draw from the host generator: nothing changes.

Two methods, one per run, chosen by the parent and passed to every process in the job:

- `DEVICE` (the default): construction under the device context, then `.to(device)` (a tensor
  made with an explicit `device="cpu"` moves as KernelBench would move it).
- `HOST`: KernelBench's way, construction with no device context, then `.to(device)`. A run
  uses it when a model cannot be built under the device context but can be on the host
  (`.numpy()` on a fresh tensor, a host `torch.Generator`, mixing a `torch.from_numpy` tensor
  with a fresh one, `torch.set_default_device` in `__init__`, which leaving the context would
  undo): `build_checked` raises `HostOnly` for it, the worker ends its run with the
  outcome `HOST_ONLY`, and the parent runs the job again with `HOST` for the reference and the
  candidate alike (`verifier.stages`), so no run ever builds them by different methods.
"""

from __future__ import annotations

import contextlib
from typing import Any

DEVICE = "device"
HOST = "host"
METHODS = (DEVICE, HOST)
HOST_ONLY = "host_construction"  # a worker's outcome: run this job again with HOST


class HostOnly(RuntimeError):
    """A model that cannot be built under the device context, but can be on the host."""


def build(cls: Any, init: Any, seed: int, device: str, method: str = DEVICE) -> Any:
    """`cls(*init)` seeded with `seed`, built by `method`, on `device`, in eval mode."""
    import torch

    if method not in METHODS:
        raise ValueError(f"construction method must be one of {', '.join(METHODS)}, "
                         f"not {method!r}")
    torch.manual_seed(seed)
    default = _global_default()
    # the cpu goes through the same context as a GPU: one code path for every backend
    with torch.device(device) if method == DEVICE else contextlib.nullcontext():
        model = cls(*init)
    if method == DEVICE and _global_default() is not default:
        # torch.set_default_device in __init__: leaving the device context took its context off
        # the stack, where KernelBench's construction keeps it for forward; torch's record of
        # it is put back as it was (the stack already is), and the host's build keeps it
        torch._GLOBAL_DEVICE_CONTEXT.device_context = default
        raise RuntimeError("__init__ called torch.set_default_device, which a device context "
                           "undoes on exit")
    return model.to(device).eval()


def _global_default() -> Any:
    """The context torch.set_default_device installed (None: none), compared by identity."""
    import torch

    return getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None)


def build_checked(cls: Any, init: Any, seed: int, device: str, method: str = DEVICE) -> Any:
    """`build`; under DEVICE, a model that raises there but builds on the host is `HostOnly`
    (its message says what raised), one that raises both ways re-raises the device's error."""
    try:
        return build(cls, init, seed, device, method)
    except Exception as exc:
        if method != DEVICE:
            raise
        try:
            build(cls, init, seed, device, HOST)
        except Exception:  # noqa: BLE001 - broken either way: the device's error stands
            raise exc from None
        raise HostOnly(f"raised under torch.device({device!r}) ({type(exc).__name__}: "
                       f"{str(exc)[:300]}) but builds on the host") from exc


def build_any(cls: Any, init: Any, seed: int, device: str) -> tuple[Any, str]:
    """(the model, the method that built it): DEVICE, else HOST. For a process that only times
    the model (a baseline), where its weights need not match anyone's."""
    try:
        return build(cls, init, seed, device, DEVICE), DEVICE
    except Exception:  # noqa: BLE001 - the host's build says whether it is broken either way
        return build(cls, init, seed, device, HOST), HOST


def finding(what: str, device: str) -> dict[str, Any]:
    """The verdict's record of a run built the KernelBench way (`what` raised on the device)."""
    return {"rule": "host_construction", "severity": "info", "line": None,
            "message": f"{what[:500]}; this run built the reference and the candidate on the "
                       f"host and moved them to {device}, as KernelBench does (same weights "
                       "on both sides, slower to build)"}
