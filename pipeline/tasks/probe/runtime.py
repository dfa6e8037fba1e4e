"""What every part of the task probe needs inside the sandbox (torch + stdlib): torch on demand,
dtype names, output flattening, error classes, blocked file access, loading a task's source and
making its inputs.
"""

from __future__ import annotations

import builtins
import io
import sys
import traceback
import types

_BLOCKED = "kernelsynth: file access blocked"


class ProbeReject(Exception):
    """The module cannot become a task; args = (reason, detail)."""


# --- helpers that need torch -----------------------------------------------------------------


def load_torch():
    import torch

    return torch


def dtype_name(dt) -> str:
    return str(dt).replace("torch.", "")


def flatten(out) -> list:
    torch = load_torch()
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, list | tuple):
        res = []
        for o in out:
            res.extend(flatten(o))
        return res
    if out is None:
        return [None]
    if isinstance(out, dict) or hasattr(out, "to_tuple"):
        vals = list(out.values()) if isinstance(out, dict) else list(out.to_tuple())
        return [v for v in flatten(vals) if v is not None]
    return [out]


def tensor_outputs(out) -> list:
    torch = load_torch()
    outs = flatten(out)
    for i, o in enumerate(outs):
        if o is None:
            raise ProbeReject("output_none", f"forward output {i} is None")
        if not isinstance(o, torch.Tensor):
            raise ProbeReject("output_not_tensor", f"forward output {i} is {type(o).__name__}")
    if not outs:
        raise ProbeReject("output_not_tensor", "forward returned no tensor")
    return outs


def classify_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    low = text.lower()
    if _BLOCKED in text or isinstance(exc, FileNotFoundError):
        return "reads_files"
    if "cuda" in low or "nccl" in low or "triton" in low:
        return "needs_gpu"
    if any(k in low for k in ("huggingface", "hf_hub", "from_pretrained", "urlopen", "socket",
                              "connection", "network", "download")):
        return "downloads"
    if isinstance(exc, MemoryError) or "memory" in low and "alloc" in low:
        return "memory"
    return "runtime_error"


def short_error(exc: BaseException) -> str:
    msg = str(exc).splitlines()[0][:200] if str(exc) else ""
    last = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    where = f" (line {last.lineno})" if last and last.filename == "task.py" else ""
    return f"{type(exc).__name__}{where}: {msg}" if msg else f"{type(exc).__name__}{where}"


def block_files() -> None:
    """Modules that read files (weights, vocabularies) are rejected, not served."""
    real_open = builtins.open

    def guarded_open(file, mode="r", *args, **kwargs):
        if isinstance(file, int):
            return real_open(file, mode, *args, **kwargs)
        raise PermissionError(f"{_BLOCKED}: {file}")

    builtins.open = guarded_open
    io.open = guarded_open
    torch = load_torch()
    torch.load = lambda *a, **k: (_ for _ in ()).throw(PermissionError(f"{_BLOCKED}: torch.load"))


def exec_source(source: str) -> dict:
    module = types.ModuleType("kernelsynth_task")
    module.__file__ = "task.py"
    sys.modules[module.__name__] = module
    ns = module.__dict__
    try:
        exec(compile(source, "task.py", "exec"), ns)
    except ProbeReject:
        raise
    except BaseException as exc:  # noqa: BLE001 - anything the file raises is a reason
        raise ProbeReject("import_error" if classify_error(exc) == "runtime_error" else classify_error(exc),
                          f"executing the file raised {short_error(exc)}") from None
    model_cls = ns.get("Model")
    torch = load_torch()
    if not (isinstance(model_cls, type) and issubclass(model_cls, torch.nn.Module)):
        raise ProbeReject("no_model", "no class Model(nn.Module)")
    return ns


def make_input(spec: dict, device: str = "cpu"):
    torch = load_torch()
    init = spec.get("init", "randn")
    if init == "none":  # an Optional argument left unset (attention_mask=None)
        return None
    shape = [int(s) for s in spec["shape"]]
    dt = getattr(torch, spec.get("dtype", "float32"))
    if device == "meta":
        return torch.empty(shape, dtype=dt, device="meta")
    if init == "randint":
        return torch.randint(int(spec.get("low") or 0), int(spec.get("high") or 2), shape,
                             dtype=dt)
    if init == "rand":
        return torch.rand(shape, dtype=dt)
    return torch.randn(shape, dtype=dt)
