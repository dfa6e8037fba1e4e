"""Stage 2, static checks on the candidate's Python and C++/CUDA source.

Every finding is `{rule, message, line, severity}`; `line` is a line of the candidate file (C++
lines are mapped through where the source literal sits in the Python file). Rules:
`torch_compute` (torch/F/nn compute in ModelNew's methods), `nn_layer` (an nn layer called in
forward), `try_fallback`, `reference_model` (subclassing, calling or importing `Model`),
`monkey_patch` (assigning attributes of torch/time/...), `threads_streams`, `precision_downgrade`,
`escape` (files, network, processes, ctypes, environment, introspection, torch._C),
`computed_attr` (attribute names computed at run time, getter functions: verifier.checks.computed_names),
`reference_name` (a warning: a name only the reference defines, under the isolated namespace),
`cpp_torch_compute` (ATen/torch compute from C++), `compiler_flag` (flags outside an allowlist).
"""

from __future__ import annotations

import ast
import re
from typing import Any

from verifier.checks.computed_names import check_computed
from verifier.checks.cpp_hiding import hidden_forms, resolve_aliases
from verifier.checks.extspec import ExtensionSpec
from verifier.checks.namespace import HINT, reference_names_used
from verifier.checks.static_rules import (
    BUILD_ENV,
    CPP_CLONE,
    CPP_ESCAPES,
    CPP_TENSOR_COMPUTE,
    CPP_THREADS,
    CPP_TORCH,
    CPP_TORCH_ALLOWED,
    ESCAPE_ATTRS,
    ESCAPE_CALLS,
    ESCAPE_MODULES,
    FLAG_OK,
    FOREIGN_ATTRS,
    FOREIGN_LIBRARIES,
    INTROSPECTION,
    LOW_PRECISION,
    MODULE_API,
    NO_COMPUTE_LAYERS,
    PATCHABLE,
    REFERENCE_MODULES,
    TENSOR_COMPUTE,
    is_aten_op,
    torch_fn_computes,
)
from verifier.pyast import dotted


def _finding(rule: str, message: str, line: int | None) -> dict[str, Any]:
    return {"rule": rule, "message": message, "line": line, "severity": "error"}


def _seen(rule: str, node: ast.AST, message: str) -> dict[str, Any]:
    """A finding whose message names the line and the source text seen there."""
    text = ast.unparse(node)
    text = text if len(text) <= 80 else text[:77] + "..."
    return _finding(rule, f"line {node.lineno}: {text}: {message}", node.lineno)


def _own_attribute(call: ast.Call) -> bool:
    """`setattr(self..., name, v)` / `delattr(self..., name)`: nn.Module code registering its own
    attributes (`setattr(self, f"conv{i}", ...)`), unless the name is a dunder."""
    if dotted(call.func) not in ("setattr", "delattr") or not call.args:
        return False
    name = call.args[1] if len(call.args) > 1 else None
    dunder = isinstance(name, ast.Constant) and str(name.value).startswith("__")
    return dotted(call.args[0]).split(".")[0] == "self" and not dunder


def _task_is_low_precision(task_source: str) -> bool:
    return bool(re.search(r"\b(float16|half|bfloat16)\b", task_source))


def _layer_attrs(cls: ast.ClassDef) -> dict[str, str]:
    """self.<attr> = nn.<Layer>(...) assignments of the class (parameter holders aside)."""
    out = {}
    for node in ast.walk(cls):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            fn = dotted(node.value.func)
            if fn.startswith(("nn.", "torch.nn.")) and fn.split(".")[-1] not in \
                    NO_COMPUTE_LAYERS:
                for t in node.targets:
                    if isinstance(t, ast.Attribute) and dotted(t.value) == "self":
                        out[t.attr] = fn
    return out


def _build_env_nodes(tree: ast.Module) -> set[int]:
    """ids of the nodes of `os.environ[K] = <str>` / `os.environ.setdefault(K, <str>)` with K a
    build setting, and of `import os` when os is used for nothing else."""
    ok: set[int] = set()
    for node in ast.walk(tree):
        key = val = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(
                node.targets[0], ast.Subscript) and dotted(node.targets[0].value) == \
                "os.environ":
            key, val = node.targets[0].slice, node.value
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and dotted(
                node.value.func) == "os.environ.setdefault" and len(node.value.args) == 2:
            key, val = node.value.args
        if isinstance(key, ast.Constant) and key.value in BUILD_ENV and isinstance(
                val, ast.Constant) and isinstance(val.value, str):
            ok.update(id(n) for n in ast.walk(node))
    uses = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "os"]
    if uses and all(id(n) in ok for n in uses):
        ok.update(id(n) for n in ast.walk(tree) if isinstance(n, ast.Import)
                  and [a.name for a in n.names] == ["os"] and n.names[0].asname is None)
    return ok


def check_python(tree: ast.Module, task_source: str, namespace: str = "isolated"
                 ) -> list[dict[str, Any]]:
    """Findings on the candidate's Python source; `namespace` is VerifyOptions.namespace (under
    kernelbench the reference's names are the candidate's too)."""
    out: list[dict[str, Any]] = []
    if namespace == "isolated":  # a warning: the NameError it leads to is the verdict
        out += [{"rule": "reference_name", "message": HINT.format(name=name), "line": line,
                 "severity": "warning"}
                for name, line in reference_names_used(tree, task_source).items()]
    build_env = _build_env_nodes(tree)
    low_ok = _task_is_low_precision(task_source)
    model_new = next((n for n in tree.body if isinstance(n, ast.ClassDef)
                      and n.name == "ModelNew"), None)
    in_model_new = {id(n) for n in ast.walk(model_new)} if model_new is not None else set()
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    for node in ast.walk(tree):
        if id(node) in build_env:
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            out += _import_findings(node)
        elif isinstance(node, ast.Name):
            out += _name_findings(node)
        elif isinstance(node, ast.Attribute):
            out += _attribute_findings(node, id(node) in called, low_ok)
        elif isinstance(node, ast.Call):
            out += _call_findings(node, low_ok)
        out += _statement_findings(node, id(node) in in_model_new)
    out += check_computed(tree, model_new)
    if model_new is not None:
        ext_names = {t.id for n in tree.body if isinstance(n, ast.Assign)
                     and isinstance(n.value, ast.Call)
                     and dotted(n.value.func).split(".")[-1] in ("load_inline", "load")
                     for t in n.targets if isinstance(t, ast.Name)}
        out += _check_model_new(model_new, ext_names)
    return _dedupe(out)


def _import_findings(node: ast.Import | ast.ImportFrom) -> list[dict[str, Any]]:
    """An import of an escape, foreign or reference module, or of a dispatcher name."""
    out = []
    names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
    for name in names:
        root = name.split(".")[0]
        if root in ESCAPE_MODULES:
            rule = "threads_streams" if root in ("threading", "multiprocessing",
                                                 "concurrent", "asyncio") else "escape"
            out.append(_seen(rule, node, f"imports {name}"))
        if root in FOREIGN_LIBRARIES:
            out.append(_seen("foreign_library", node, f"imports {name}: compute "
                             "outside torch that no trace of forward sees"))
        hidden = sorted(ESCAPE_ATTRS.intersection(name.split(".")[1:]))
        if hidden:  # `from torch.utils._python_dispatch import ...`
            out.append(_seen("escape", node, f"imports {name} ({hidden[0]}: the "
                                             "dispatcher or the interpreter)"))
        if root in REFERENCE_MODULES:
            out.append(_finding("reference_model", f"imports {name} (the reference)",
                                node.lineno))
    if isinstance(node, ast.ImportFrom) and node.module and any(
            a.name in ESCAPE_ATTRS for a in node.names):
        out.append(_seen("escape", node, "imports a name of the dispatcher or the "
                                         "interpreter"))
    if isinstance(node, ast.ImportFrom) and any(a.name == "Model" for a in node.names):
        out.append(_finding("reference_model", "imports the reference Model", node.lineno))
    return out


def _name_findings(node: ast.Name) -> list[dict[str, Any]]:
    """The reference Model, or the interpreter's module globals, named."""
    if node.id == "Model":
        return [_finding("reference_model", "uses the reference Model", node.lineno)]
    if node.id in ("__builtins__", "__loader__", "__spec__"):
        return [_seen("escape", node, f"accesses {node.id}")]
    return []


def _attribute_findings(node: ast.Attribute, called: bool, low_ok: bool
                        ) -> list[dict[str, Any]]:
    """An attribute that escapes, reaches foreign compute, introspects, or downgrades an fp32
    task's precision (`called`: the attribute is called, as nn.Module's own `modules()`)."""
    if node.attr in ESCAPE_ATTRS and not (
            node.attr == "_C" and dotted(node) in ("torch._C",)) and not (
            node.attr in MODULE_API and called):
        return [_seen("escape", node, f"reaches .{node.attr} (the OS, the interpreter "
                                      "or the harness)")]
    if node.attr in FOREIGN_ATTRS:
        return [_seen("foreign_library", node, f"reaches .{node.attr} (numpy, or a "
                                               "tensor's memory handed to it: compute "
                                               "outside torch)")]
    if node.attr in INTROSPECTION:
        return [_seen("escape", node, f"introspection through {node.attr}")]
    if dotted(node) in ("os.environ", "sys.modules", "torch.backends"):
        return [_seen("escape", node, f"accesses {dotted(node)}")]
    if node.attr in ("float16", "half", "bfloat16") and dotted(node).startswith("torch.") \
            and not low_ok:
        return [_finding("precision_downgrade", f"uses {dotted(node)} in an fp32 task",
                         node.lineno)]
    return []


def _call_findings(node: ast.Call, low_ok: bool) -> list[dict[str, Any]]:
    """A call that escapes, starts threads or streams, downgrades precision or patches torch."""
    out = []
    fn = dotted(node.func)
    if fn in ESCAPE_CALLS and not _own_attribute(node):
        out.append(_seen("escape", node, f"calls {fn}()"))
    elif fn.split(".")[0] in ("os", "sys") or fn in ("torch.load", "torch.save"):
        out.append(_seen("escape", node, f"calls {fn}()"))
    if fn.endswith(("cuda.Stream", "cuda.stream", "musa.Stream", "musa.stream")) or \
            fn.endswith(("Thread", "Process", "ThreadPoolExecutor")):
        out.append(_finding("threads_streams", f"creates {fn}", node.lineno))
    if fn.split(".")[-1] in ("half", "bfloat16") and not low_ok and isinstance(
            node.func, ast.Attribute):
        out.append(_finding("precision_downgrade",
                            f".{fn.split('.')[-1]}() in an fp32 task", node.lineno))
    if fn in ("torch.set_default_dtype", "torch.set_float32_matmul_precision",
              "torch.set_num_threads", "torch._C._set_dispatch_mode") or fn.startswith(
            ("torch._C.", "torch.utils._python_dispatch", "torch._dynamo")):
        out.append(_seen("monkey_patch", node, f"calls {fn}"))
    return out


def _statement_findings(node: ast.AST, in_model_new: bool) -> list[dict[str, Any]]:
    """An assignment to a patchable module's attribute; a try in ModelNew (a fallback path)."""
    out = []
    if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for t in targets:
            d = dotted(t) if isinstance(t, ast.Attribute) else ""
            if d and d.split(".")[0] in PATCHABLE:
                out.append(_seen("monkey_patch", node, f"assigns {d}"))
    if isinstance(node, ast.Try | ast.TryStar) and in_model_new:
        out.append(_finding("try_fallback", "try/except in ModelNew (a fallback path)",
                            node.lineno))
    return out


def _check_model_new(cls: ast.ClassDef, ext_names: set[str]) -> list[dict[str, Any]]:
    out = []
    for base in cls.bases:
        if dotted(base).split(".")[-1] == "Model":
            out.append(_finding("reference_model", "ModelNew subclasses the reference Model",
                                cls.lineno))
    layers = _layer_attrs(cls)
    for fn in cls.body:
        if not isinstance(fn, ast.FunctionDef) or fn.name == "__init__":
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
                out.append(_finding("torch_compute", "the @ operator computes with torch",
                                    node.lineno))
            if not isinstance(node, ast.Call):
                continue
            name = dotted(node.func)
            head, _, last = name.rpartition(".")
            if head in ("torch", "torch.nn.functional", "F", "torch.special", "torch.linalg",
                        "torch.fft") and (head != "torch" and head not in ("F",
                                                                         "torch.nn.functional")
                                          or torch_fn_computes(last)):
                out.append(_finding("torch_compute", f"{name}() computes with torch in "
                                                     f"ModelNew.{fn.name}", node.lineno))
            elif head == "self" and last in layers:
                out.append(_finding("nn_layer", f"self.{last} ({layers[last]}) is called in "
                                                f"ModelNew.{fn.name}", node.lineno))
            elif isinstance(node.func, ast.Attribute) and last in TENSOR_COMPUTE and \
                    not head.startswith(("self.", "torch")) and head != "self" and \
                    head not in ext_names:
                out.append(_finding("torch_compute", f".{last}() computes with torch in "
                                                     f"ModelNew.{fn.name}", node.lineno))
    return out


def _dedupe(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen, out = set(), []
    for f in findings:
        k = (f["rule"], f["message"], f["line"])
        if k not in seen:
            seen.add(k)
            out.append(f)
    return out


def _strip_comments(src: str) -> str:
    src = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), src, flags=re.S)
    return re.sub(r"//[^\n]*", "", src)


def _flag_ok(flag: str) -> bool:
    """On the allowlist; a flag nvcc hands to the host compiler (-Xcompiler a,b) only when
    each flag it hands over is (-fplugin=, -B, -specs= there read files too)."""
    m = re.fullmatch(r"(?:-Xcompiler|--compiler-options)=?(.*)", flag)
    if m:
        return all(FLAG_OK.match(f) for f in m.group(1).split(",") if f) and bool(m.group(1))
    return bool(FLAG_OK.match(flag))


def check_cpp(specs: list[ExtensionSpec], code: str, task_source: str) -> list[dict[str, Any]]:
    """Findings on the C++/CUDA sources and flags of the candidate's extensions."""
    from verifier.checks.extspec import source_line
    from verifier.checks.preprocess import scan as scan_directives

    out: list[dict[str, Any]] = []
    low_ok = _task_is_low_precision(task_source)
    for spec in specs:
        for flag in [*spec.extra_cflags, *spec.extra_cuda_cflags, *spec.extra_ldflags]:
            if not _flag_ok(flag.strip()):
                out.append(_finding("compiler_flag", f"compiler/linker flag {flag!r} is not "
                                                     "allowed", spec.line or None))
        if spec.extra_include_paths:
            out.append(_finding("compiler_flag", "extra_include_paths are not allowed",
                                spec.line or None))
        for src in [*spec.cpp_sources, *spec.cuda_sources]:
            base = source_line(code, src)
            clean = resolve_aliases(_strip_comments(src))  # `namespace K = at;` -> at::
            # what the preprocessor sees (digraphs, splices, macro operands), not the raw text
            for reason in scan_directives(src).reject:
                out.append(_finding("build_file_access", reason, base or spec.line or None))

            def line_of(pos: int, _clean: str = clean, _base: int = base,
                        _call: int = spec.line) -> int | None:
                return _base + _clean.count("\n", 0, pos) if _base else (_call or None)

            for m in CPP_TORCH.finditer(clean):
                ns, name = m.group(2), m.group(3)
                if ns.startswith(("native::", "nn::functional::", "linalg::", "special::",
                                  "fft::")) or (name not in CPP_TORCH_ALLOWED
                                                and not ns.startswith(("cuda::", "musa::"))):
                    out.append(_finding("cpp_torch_compute",
                                        f"{m.group(1)}::{ns}{name} computes with ATen from C++",
                                        line_of(m.start())))
            for m in CPP_TENSOR_COMPUTE.finditer(clean):
                out.append(_finding("cpp_torch_compute", f"tensor method .{m.group(1)}() "
                                                         "computes with ATen from C++",
                                    line_of(m.start())))
            for m in CPP_ESCAPES.finditer(clean):
                out.append(_finding("escape", f"{m.group(0).strip()} (file/process/network "
                                              "access from C++)", line_of(m.start())))
            for rule, message, pos in hidden_forms(clean, CPP_TORCH_ALLOWED, is_aten_op):
                out.append(_finding(rule, message, line_of(pos)))
            for m in CPP_CLONE.finditer(clean):
                if not m.group(1):
                    out.append(_finding("escape", f"{m.group(0).strip()} (the clone syscall: "
                                                  "process creation from C++)",
                                        line_of(m.start())))
            for m in CPP_THREADS.finditer(clean):
                out.append(_finding("threads_streams", f"{m.group(1)} in C++",
                                    line_of(m.start())))
            if not low_ok:
                for m in LOW_PRECISION.finditer(clean):
                    out.append(_finding("precision_downgrade", f"{m.group(1)} in an fp32 task",
                                        line_of(m.start())))
    return _dedupe(out)
