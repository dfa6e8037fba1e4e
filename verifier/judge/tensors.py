"""Plain operations on a forward's inputs and outputs (a tensor, or a list or tuple of tensors
and plain values), shared by the worker, the judges and the parent's own recheck."""

from __future__ import annotations

from typing import Any


def flatten(out: Any) -> list[Any]:
    """A forward's outputs as a list (one output is a list of one)."""
    if isinstance(out, tuple | list):
        return list(out)
    return [out]


def clone(xs: Any) -> Any:
    """A copy of every tensor in `xs`, containers rebuilt, plain values kept."""
    import torch

    if isinstance(xs, torch.Tensor):
        return xs.clone()
    if isinstance(xs, list | tuple):
        return type(xs)(clone(x) for x in xs)
    return xs


def same(a: Any, b: Any, every: bool = False) -> bool:
    """Whether `a` and `b` hold the same values exactly (shapes, dtypes and every element);
    `every`: each pair compared even after one differs (the same work either way)."""
    import torch

    fa, fb = flatten(a), flatten(b)
    if len(fa) != len(fb):
        return False
    alike = True
    for x, y in zip(fa, fb, strict=True):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            alike = (x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y)) and alike
        else:
            alike = bool(x == y) and alike
        if not alike and not every:
            return False
    return alike


def varies(out: Any) -> bool:
    """Whether any tensor of a forward's outputs holds two different values. A constant output
    seen again on new inputs is a kernel that ignores them, as a merely wrong one does (a flag
    left False, a fill of zeros): no evidence of a kept result (`decide.CACHED_RESULT`)."""
    import torch

    for x in flatten(out):
        if isinstance(x, torch.Tensor) and x.numel() > 1:
            flat = x.detach().reshape(-1)
            if bool((flat != flat[0]).any()):
                return True
    return False


def to_device(obj: Any, device: str) -> Any:
    """`obj` with every tensor moved to `device`, containers rebuilt."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, list | tuple):
        return type(obj)(to_device(o, device) for o in obj)
    return obj


def exact_fp32() -> None:
    """Reference math in true fp32: no TF32 in cuBLAS or cuDNN (torch enables it for cuDNN).

    With TF32 on, an fp32 conv reference carries ~1e-3 relative error, so an exact fp32 kernel
    fails the fp32 tolerance against it; TF32 is a precision downgrade, not the task.
    """
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
