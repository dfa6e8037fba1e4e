"""Sandbox child: trace a KernelBench reference to an ATen graph (torch + stdlib only).

Reads `task.py` from the working directory, builds `Model(*get_init_inputs())` and the inputs on
the meta device (no memory, no compute), traces `forward` with `make_fx` (parameters and buffers
as explicit placeholders) and writes `result.json`: one entry per node with its ATen target,
encoded arguments, output shape/stride/dtype, plus the parameter names in placeholder order.
Run as a script (not `-m`) so importing it pulls in nothing but torch.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
import types
from pathlib import Path


def _write(result: dict) -> None:
    Path("result.json").write_text(json.dumps(result), encoding="utf-8")


def _sym(value, torch):
    """A SymInt as {"sym": expression over input-dim symbols, "value": traced size}."""
    expr = value.node.expr
    if getattr(expr, "is_number", False):
        return int(expr)
    return {"sym": str(expr), "value": int(value.node.hint)}


def _encode(value, torch, fx):
    if isinstance(value, fx.Node):
        val = value.meta.get("val")
        if isinstance(val, torch.SymInt):  # a size computed from input dims, not a tensor
            return _sym(val, torch)
        return {"node": value.name}
    if isinstance(value, torch.SymInt):
        return _sym(value, torch)
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


def _dim(value, torch):
    return _sym(value, torch) if isinstance(value, torch.SymInt) else int(value)


def _meta_of(val, torch) -> dict | list | None:
    if isinstance(val, torch.Tensor):
        return {"shape": [_dim(s, torch) for s in val.shape],
                "stride": [_dim(s, torch) for s in val.stride()],
                "dtype": str(val.dtype).replace("torch.", ""),
                "contiguous": bool(val.is_contiguous()),
                "offset": _dim(val.storage_offset(), torch)}
    if isinstance(val, list | tuple):
        return [_meta_of(v, torch) for v in val]
    return None


def _isolate() -> None:
    """Keep this file's folder off the import path (run as a script, Python puts it first, and a
    template module there such as `symbolic.py` would shadow a package of that name), and give
    torch's compile caches a writable home and a user name inside the sandbox."""
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if p and Path(p).resolve() != here]
    work = Path.cwd()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(work / "inductor-cache"))
    os.environ.setdefault("TRITON_CACHE_DIR", str(work / "triton-cache"))
    os.environ.setdefault("USER", "kernelsynth-probe")  # getpass needs no passwd entry then


def _tracer_error() -> str | None:
    """Import what make_fx imports lazily, once, before any reference: a failure is reported
    as itself. Left to the first trace, a half-finished import of torch._dynamo is retried by
    the next trace and fails as "Artifact of type=precompile already registered in mega-cache
    artifact factory", hiding the real cause, once per task."""
    try:
        import torch._dynamo  # noqa: F401
        from torch.fx.experimental.proxy_tensor import make_fx  # noqa: F401
    except BaseException as exc:  # noqa: BLE001 - reported for every task of the batch
        return (f"torch._dynamo cannot be imported in the probe sandbox: "
                f"{type(exc).__name__}: {str(exc)[:300]}")
    return None


def main() -> None:
    _isolate()
    broken = _tracer_error()
    many = Path("tasks.json")
    if broken is not None:
        failed = {"ok": False, "reason": broken}
        if many.exists():
            _write({"ok": True, "batch": [failed for _ in json.loads(
                many.read_text(encoding="utf-8"))]})
        else:
            _write(failed)
        return
    if many.exists():  # batch mode: one torch import for many references
        results = []
        for item in json.loads(many.read_text(encoding="utf-8")):
            src, other = item if isinstance(item, list) else (item, None)
            results.append(_traced(src, other))
        _write({"ok": True, "batch": results})
        return
    other = Path("task_other.py")
    _write(_traced(Path("task.py").read_text(encoding="utf-8"),
                   other.read_text(encoding="utf-8") if other.exists() else None))


def _traced(src: str, other: str | None) -> dict:
    """The trace of `src`, with the trace of the same task at other sizes under "other"."""
    out = _traced_one(src)
    if other is not None and out.get("ok"):
        out["other"] = _traced_one(other)
    return out


def _traced_one(src: str) -> dict:
    _write({"ok": False, "reason": "probe crashed"})
    try:
        trace(src)
        return json.loads(Path("result.json").read_text(encoding="utf-8"))
    except BaseException as exc:  # noqa: BLE001 - one bad task must not end the batch
        return {"ok": False, "reason": f"probe raised {type(exc).__name__}"}


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

    gm, first = _trace_symbolic(call, state, inputs, torch)
    symbolic = gm is not None
    try:
        gm = gm or make_fx(call)(*state, *inputs)
    except BaseException as exc:  # noqa: BLE001
        tb = traceback.format_exc(limit=3).splitlines()[-1]
        # the symbolic attempt's error first: a failed first import of torch._dynamo leaves
        # the second attempt a misleading one ("Artifact ... already registered")
        _write({"ok": False, "reason": f"tracing failed: {type(exc).__name__}: {tb[:200]}"
                                       f" (symbolic tracing first: {first[:300]})"})
        return
    nodes = _nodes(gm, torch, fx)
    scalars = _constructor_scalars(ns, init, model, nodes, torch, fx)
    training = bool(model.training)
    _write({"ok": True, "params": names, "nodes": nodes, "num_inputs": len(inputs),
            "training": training, "symbolic": symbolic, "scalars": scalars,
            "int_attrs": _attrs(model, int)})


def _trace_symbolic(call, state, inputs, torch):
    """make_fx with symbolic sizes (no duck sizing, so equal sizes stay distinct symbols).

    Shapes then come out as expressions over the inputs' and parameters' dims (conv and pool
    output sizes included), so the candidate computes them at run time. None when a traced op
    has no symbolic rule; the caller falls back to a trace at the task's fixed sizes. The
    second value is the failure (empty on success), reported if the fallback fails too.
    """
    from torch.fx.experimental import _config
    from torch.fx.experimental.proxy_tensor import make_fx

    try:
        with _config.patch(use_duck_shape=False):
            return make_fx(call, tracing_mode="symbolic")(*state, *inputs), ""
    except BaseException as exc:  # noqa: BLE001 - any failure means: trace at fixed sizes
        return None, f"{type(exc).__name__}: {traceback.format_exc(limit=-2)[-300:]}"


def _nodes(gm, torch, fx) -> list[dict]:
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
    return nodes


def _float_attrs(model) -> dict[str, float]:
    return _attrs(model, float)


def _attrs(model, kind: type) -> dict:
    """`self.<path>` -> value for every attribute of type `kind` (bools excluded) in the tree."""
    out = {}
    for prefix, mod in model.named_modules():
        for key, val in vars(mod).items():
            if type(val) is kind and not key.startswith("_"):
                path = "".join(f"[{q}]" if q.isdigit() else f".{q}"
                               for q in prefix.split(".") if q)
                out[f"self{path}.{key}"] = val  # self.net[0].negative_slope
    return out


def _aten_nodes(nodes: list[dict]) -> list[dict]:
    return [n for n in nodes if n["op"] == "call_function" and n["target"].startswith("aten.")
            and not n["target"].startswith("aten.sym_")]


def _constructor_scalars(ns, init, model, nodes, torch, fx) -> list[dict]:
    """Float literals of the graph that are constructor values, with the attribute holding them.

    The module is built again with every float constructor argument changed and traced at fixed
    sizes; a literal that moves with the arguments and equals a float attribute of the module in
    both builds is that attribute (`self.scale`), not a constant of the task.
    """
    from torch.func import functional_call
    from torch.fx.experimental.proxy_tensor import make_fx

    init = list(init)
    if not any(isinstance(v, float) for v in init):
        return []
    other = [v * 1.375 + 0.125 if isinstance(v, float) else v for v in init]
    try:
        with torch.device("meta"):
            model_b = ns["Model"](*other)
            inputs = list(ns["get_inputs"]())
        names = [n for n, _ in model_b.named_parameters()] + [
            n for n, _ in model_b.named_buffers()]
        state = [t for _, t in model_b.named_parameters()] + [
            t for _, t in model_b.named_buffers()]
        k = len(names)

        def call(*flat):
            return functional_call(model_b, dict(zip(names, flat[:k], strict=True)),
                                   tuple(flat[k:]))

        nodes_b = _nodes(make_fx(call)(*state, *inputs), torch, fx)
    except BaseException:  # noqa: BLE001 - no second build: every literal stays a literal
        return []
    attrs_a, attrs_b = _float_attrs(model), _float_attrs(model_b)
    a_nodes, b_nodes = _aten_nodes(nodes), _aten_nodes(nodes_b)
    if [n["target"] for n in a_nodes] != [n["target"] for n in b_nodes]:
        return []
    found = []
    for na, nb in zip(a_nodes, b_nodes, strict=True):
        for key, va in na["named"].items():
            vb = nb["named"].get(key)
            if not (isinstance(va, float) and isinstance(vb, float)) or va == vb:
                continue
            attr = next((p for p, v in attrs_a.items() if v == va and attrs_b.get(p) == vb), None)
            if attr is not None:
                found.append({"node": na["name"], "arg": key, "attr": attr})
    return found


if __name__ == "__main__":
    main()
