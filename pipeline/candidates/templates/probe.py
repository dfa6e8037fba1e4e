"""Sandbox child: trace a KernelBench reference to an ATen graph (torch + stdlib only).

Reads `task.py` from the working directory, builds `Model(*get_init_inputs())` and the inputs on
the meta device (no memory, no compute), traces `forward` with `make_fx` (parameters and buffers
as explicit placeholders) and writes `result.json`: one entry per node with its ATen target,
encoded arguments, output shape/stride/dtype, plus the parameter names in placeholder order.
Run as a script (not `-m`) so importing it pulls in nothing but torch.
"""

from __future__ import annotations

import json
import sys
import traceback
import types
from pathlib import Path


def _write(result: dict) -> None:
    Path("result.json").write_text(json.dumps(result), encoding="utf-8")


def _encode(value, torch, fx):
    if isinstance(value, fx.Node):
        return {"node": value.name}
    if isinstance(value, list | tuple):
        return [_encode(v, torch, fx) for v in value]
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return {"float": repr(value)}
        return value
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).replace("torch.", "")}
    if isinstance(value, torch.device | torch.layout | torch.memory_format):
        return {"opaque": str(value)}
    return {"unknown": type(value).__name__}


def _meta_of(val, torch) -> dict | list | None:
    if isinstance(val, torch.Tensor):
        return {"shape": list(val.shape), "stride": list(val.stride()),
                "dtype": str(val.dtype).replace("torch.", ""),
                "contiguous": bool(val.is_contiguous()),
                "offset": int(val.storage_offset())}
    if isinstance(val, list | tuple):
        return [_meta_of(v, torch) for v in val]
    return None


def main() -> None:
    many = Path("tasks.json")
    if many.exists():  # batch mode: one torch import for many references
        results = []
        for src in json.loads(many.read_text(encoding="utf-8")):
            _write({"ok": False, "reason": "probe crashed"})
            try:
                trace(src)
                results.append(json.loads(Path("result.json").read_text(encoding="utf-8")))
            except BaseException as exc:  # noqa: BLE001 - one bad task must not end the batch
                results.append({"ok": False, "reason": f"probe raised {type(exc).__name__}"})
        _write({"ok": True, "batch": results})
        return
    trace(Path("task.py").read_text(encoding="utf-8"))


def trace(src: str) -> None:
    """Trace one reference source and write its result.json."""
    import torch
    import torch.fx as fx
    from torch.func import functional_call
    from torch.fx.experimental.proxy_tensor import make_fx

    torch.set_num_threads(1)
    module = types.ModuleType("kernelsynth_ref")
    module.__file__ = "task.py"
    sys.modules[module.__name__] = module
    ns = module.__dict__
    try:
        exec(compile(src, "task.py", "exec"), ns)
        init = ns["get_init_inputs"]()
        with torch.device("meta"):
            model = ns["Model"](*init)
            inputs = list(ns["get_inputs"]())
    except BaseException as exc:  # noqa: BLE001 - report anything the reference raises
        _write({"ok": False, "reason": f"loading the reference raised {type(exc).__name__}: "
                                       f"{str(exc)[:200]}"})
        return
    if not all(isinstance(x, torch.Tensor) for x in inputs):
        _write({"ok": False, "reason": "non-tensor forward inputs are not supported"})
        return
    names = [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers()]
    state = [t for _, t in model.named_parameters()] + [t for _, t in model.named_buffers()]
    k = len(names)

    def call(*flat):
        return functional_call(model, dict(zip(names, flat[:k], strict=True)), tuple(flat[k:]))

    try:
        gm = make_fx(call)(*state, *inputs)
    except BaseException as exc:  # noqa: BLE001
        tb = traceback.format_exc(limit=3).splitlines()[-1]
        _write({"ok": False, "reason": f"tracing failed: {type(exc).__name__}: {tb[:200]}"})
        return
    nodes = []
    for node in gm.graph.nodes:
        target = node.target
        if node.op == "call_function":
            tname = str(target)  # e.g. aten.addmm.default
            if hasattr(target, "_schema"):
                tname = "aten." + target._schema.name.split("::", 1)[1]
                if target._schema.overload_name:
                    tname += "." + target._schema.overload_name
            elif getattr(target, "__name__", "") == "getitem":
                tname = "getitem"
        else:
            tname = str(target)
        named = {}
        if node.op == "call_function" and hasattr(target, "_schema"):
            for i, arg in enumerate(target._schema.arguments):
                if i < len(node.args):
                    val = node.args[i]
                elif arg.name in node.kwargs:
                    val = node.kwargs[arg.name]
                elif arg.has_default_value():
                    val = arg.default_value
                else:
                    continue
                named[arg.name] = _encode(val, torch, fx)
        nodes.append({
            "name": node.name, "op": node.op, "target": tname,
            "args": _encode(list(node.args), torch, fx),
            "kwargs": {k2: _encode(v, torch, fx) for k2, v in node.kwargs.items()},
            "named": named,
            "meta": _meta_of(node.meta.get("val"), torch),
            "users": [u.name for u in node.users],
        })
    training = bool(model.training)
    _write({"ok": True, "params": names, "nodes": nodes, "num_inputs": len(inputs),
            "training": training})


if __name__ == "__main__":
    main()
