"""Which globals a candidate module starts with: its own (`isolated`) or the reference file's
(`kernelbench`, as KernelBench execs reference and candidate in one dict), and the hint a
candidate gets when it fails on a name only the reference defines.

Stdlib only; the worker calls `candidate_globals` where it execs the candidate, the static
stage `reference_names_used`, and the feedback `name_error_hint`.
"""

from __future__ import annotations

import ast
import builtins
import copy
import re
import types
from typing import Any

from verifier import pyast
from verifier.protocol import NAMESPACES

# never handed over: the reference model itself (calling it is the `reference_model` rule's
# cheat), and modules that reach the OS or the interpreter (the candidate may not import them)
_WITHHELD = frozenset({"Model"})
_ESCAPE_ROOTS = frozenset({"os", "sys", "subprocess", "ctypes", "importlib", "inspect", "gc",
                           "builtins", "socket", "shutil", "pathlib", "io", "signal", "types",
                           "multiprocessing", "threading", "pickle", "marshal", "tempfile"})
_NAME_ERROR = re.compile(r"NameError: name '(\w+)' is not defined")
HINT = ("`{name}` is defined in the reference file; candidates run in their own namespace "
        "(use --namespace kernelbench for KernelBench's behaviour)")


def candidate_globals(reference_namespace: dict[str, Any], mode: str) -> dict[str, Any]:
    """The globals the candidate module starts with under `mode` (isolated | kernelbench)."""
    if mode not in NAMESPACES:
        raise ValueError(f"namespace must be one of {', '.join(NAMESPACES)}, not {mode!r}")
    if mode == "isolated":
        return {}
    out: dict[str, Any] = {}
    for name, value in reference_namespace.items():
        if name.startswith("__") or name in _WITHHELD:
            continue
        if isinstance(value, types.ModuleType):
            if value.__name__.split(".")[0] in _ESCAPE_ROOTS:
                continue
            out[name] = value
        elif isinstance(value, type) or callable(value):
            out[name] = value  # helpers and classes: shared, as in KernelBench
        else:  # data (sizes, lists, tensors): the candidate's own copy, so the reference's
            # get_inputs never sees what a candidate wrote into it
            try:
                out[name] = copy.deepcopy(value)
            except (TypeError, RuntimeError, copy.Error):  # not copyable (a lock, a generator):
                out[name] = value  # shared, as KernelBench shares everything
    return out


def reference_names(task_source: str) -> set[str]:
    """Names the reference file binds at its top level (sizes, helpers, imports, classes)."""
    try:
        tree = pyast.parse(task_source)
    except (SyntaxError, ValueError, RecursionError):
        return set()
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
    return names - {"*"}


def free_names(tree: ast.Module) -> dict[str, int]:
    """Names the module reads but binds nowhere (and that are not builtins): name -> first line.
    Empty when a star import could bind anything."""
    bound: set[str] = set(dir(builtins)) | {"__file__", "__name__", "__doc__", "__spec__",
                                            "__loader__", "__builtins__", "__package__"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            return {}
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bound.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.MatchAs | ast.MatchStar) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            bound.add(node.rest)
    free: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and \
                node.id not in bound:
            free[node.id] = min(free.get(node.id, node.lineno), node.lineno)
    return free


def reference_names_used(tree: ast.Module, task_source: str) -> dict[str, int]:
    """Names the candidate reads without binding that the reference file defines: they exist
    only under --namespace kernelbench. name -> first line."""
    ref = reference_names(task_source) - _WITHHELD
    return {n: line for n, line in free_names(tree).items() if n in ref}


def name_error_hint(error: str, findings: list[dict[str, Any]]) -> str:
    """The hint for a NameError on a name that the static stage saw the reference define
    (a `reference_name` finding), else ""."""
    m = _NAME_ERROR.search(error or "")
    if not m:
        return ""
    name = m.group(1)
    if any(f.get("rule") == "reference_name" and f.get("message", "").startswith(f"`{name}`")
           for f in findings):
        return HINT.format(name=name)
    return ""
