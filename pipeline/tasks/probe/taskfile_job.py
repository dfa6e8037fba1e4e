"""The probe's `taskfile` job: load a KernelBench file (torch + stdlib, inside the probe's child),
check its interface, scale a CPU copy (see `pipeline.tasks.probe.scale`), run the reference forward
on CPU and report shapes, dtypes, init inputs and the scaled constants.
"""

from __future__ import annotations

import ast
import inspect
import math
import sys
import time
import traceback
import types
from collections.abc import Callable

from pipeline.tasks.probe.dims import derived_refresher, int_constants, tie_partners
from pipeline.tasks.probe.scale import footprint, input_numel, is_alloc_failure, scale_constants
from verifier import pyast


class _Invalid(Exception):
    """The file is not a valid task; args[0] is the one-line reason."""


def _jsonable(value):
    import torch

    if isinstance(value, bool | int | float | str) or value is None:
        return value
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, torch.dtype):
        return str(value)
    raise TypeError(f"init input of type {type(value).__name__} is not JSON-serializable")


def _spec(name: str, t) -> dict:
    import torch

    spec = {"name": name, "shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
            "init": "randn", "low": None, "high": None}
    if t.device.type == "meta" or t.numel() == 0:
        return spec
    if t.dtype == torch.bool:
        spec.update(init="randint", low=0.0, high=2.0)
    elif not t.is_floating_point():
        spec.update(init="randint", low=float(t.min()), high=float(t.max()) + 1)
    else:
        lo, hi = float(t.min()), float(t.max())
        if lo >= 0.0 and hi <= 1.0:
            spec.update(init="rand", low=0.0, high=1.0)
    return spec


def _load(source: str) -> tuple[ast.Module, dict]:
    import torch

    try:
        tree = pyast.parse(source, "task.py")
    except SyntaxError as exc:
        raise _Invalid(f"syntax error at line {exc.lineno}: {exc.msg}") from None
    module = types.ModuleType("kernelsynth_task")
    module.__file__ = "task.py"
    sys.modules[module.__name__] = module
    ns = module.__dict__
    try:
        exec(compile(tree, "task.py", "exec"), ns)
    except BaseException as exc:  # noqa: BLE001 - report anything the file raises
        raise _Invalid(f"executing the file raised {type(exc).__name__}: {str(exc)[:200]}"
                       ) from None
    model_cls = ns.get("Model")
    if not (isinstance(model_cls, type) and issubclass(model_cls, torch.nn.Module)):
        raise _Invalid("no class Model(nn.Module)")
    for fn in ("get_inputs", "get_init_inputs"):
        if not callable(ns.get(fn)):
            raise _Invalid(f"missing function {fn}()")
    return tree, ns


def check_taskfile(job: dict, budget: Callable[[float | None], None]) -> dict:
    """The `taskfile` job (`source`, `scale`, `cpu_max_numel`, `seed`); `budget(flops)` sets the
    time budget once the FLOPs at GPU size are known (None while counting)."""
    try:
        return _check(job, budget)
    except _Invalid as exc:
        return {"valid": False, "reason": exc.args[0]}


def _check(job: dict, budget: Callable[[float | None], None]) -> dict:
    import torch

    tree, ns = _load(job["source"])
    constants, partners = int_constants(tree), tie_partners(tree)
    scaled: dict[str, int] = {}
    try:
        if job.get("scale"):  # FLOPs cost a meta run (seconds for a deep model)
            budget(None)
            budget(footprint(ns)[1])
        if job.get("scale") and job.get("cpu_max_numel"):
            scaled = scale_constants(ns, constants, int(job["cpu_max_numel"]),
                                     lambda: input_numel(ns), lambda: footprint(ns, True),
                                     derived_refresher(tree, [*constants, *partners]),
                                     partners)
        init_inputs = ns["get_init_inputs"]()
        if not isinstance(init_inputs, list | tuple):
            raise _Invalid(f"get_init_inputs() returned {type(init_inputs).__name__}, not a list")
        init_json = _jsonable(list(init_inputs))
        torch.manual_seed(job.get("seed", 0))
        model = ns["Model"](*init_inputs).eval()
        torch.manual_seed(job.get("seed", 0) + 1)
        inputs = ns["get_inputs"]()
        if not isinstance(inputs, list | tuple):
            raise _Invalid(f"get_inputs() returned {type(inputs).__name__}, not a list")
        params = list(inspect.signature(model.forward).parameters)
        names = [params[i] if i < len(params) else f"arg{i}" for i in range(len(inputs))]
        in_specs = [_spec(name, x) if isinstance(x, torch.Tensor) else
                    {"name": name, "shape": [], "dtype": type(x).__name__, "init": "given",
                     "low": None, "high": None, "value": x}
                    for name, x in zip(names, inputs, strict=True)]
        clones = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
        start = time.perf_counter()
        with torch.no_grad():
            out = model(*inputs)
        forward_ms = (time.perf_counter() - start) * 1e3
    except _Invalid:
        raise
    except BaseException as exc:  # noqa: BLE001
        text = str(exc).splitlines()[0] if str(exc) else ""
        if isinstance(exc, MemoryError) or is_alloc_failure(str(exc)):
            return {"valid": False, "too_large_for_host": True, "scaled_constants": scaled,
                    "reason": f"too_large_for_host: {text[:160] or 'MemoryError'}"}
        last = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
        where = f" (line {last.lineno})" if last and last.filename == "task.py" else ""
        raise _Invalid(f"reference raised {type(exc).__name__}{where}"
                       + (f": {text[:200]}" if text else "")) from None
    outs = out if isinstance(out, list | tuple) else [out]
    out_specs = []
    for i, o in enumerate(outs):
        if not isinstance(o, torch.Tensor):
            raise _Invalid(f"forward output {i} is {type(o).__name__}, not a tensor")
        out_specs.append(_spec(f"out{i}" if len(outs) > 1 else "out", o))
    finite = all(bool(torch.isfinite(o).all()) for o in outs if o.is_floating_point())
    mutated = [n for n, a, b in zip(names, inputs, clones, strict=True)
               if isinstance(a, torch.Tensor) and not torch.equal(a, b)]
    return {
        "valid": True, "reason": "", "init_inputs": init_json, "inputs": in_specs,
        "outputs": out_specs, "constants": constants, "scaled_constants": scaled,
        "forward_ms": forward_ms, "finite": finite, "mutated_inputs": mutated,
        "num_params": sum(p.numel() for p in model.parameters()),
        "output_abs_mean": [float(o.float().abs().mean()) if o.numel() else 0.0 for o in outs],
        "input_numel": sum(math.prod(s["shape"]) for s in in_specs),
    }
