"""Find a candidate's `load_inline(...)` calls without running it, and key them by content.

The compile service builds every extension a candidate asks for ahead of execution; the GPU
worker answers the candidate's `load_inline` from those builds by the same key. Arguments are
resolved statically: string literals, module-level names bound to strings (also `+`-joined,
f-strings without fields, lists/tuples of them). A call whose arguments cannot be resolved is
left to the real `load_inline` at run time (correct, only slower).
"""

from __future__ import annotations

import ast
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

_ARG_ORDER = ("name", "cpp_sources", "cuda_sources", "functions", "extra_cflags",
              "extra_cuda_cflags", "extra_ldflags", "extra_include_paths")


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def inline_key(cpp_sources: Any, cuda_sources: Any = None, functions: Any = None,
               extra_cflags: Any = None, extra_cuda_cflags: Any = None, extra_ldflags: Any = None,
               extra_include_paths: Any = None) -> str:
    """Content key of one load_inline call (the extension name does not matter)."""
    funcs: Any = functions
    if isinstance(funcs, dict):
        funcs = sorted(funcs.items())
    elif funcs is not None:
        funcs = _as_list(funcs)
    payload = json.dumps([_as_list(cpp_sources), _as_list(cuda_sources), funcs,
                          _as_list(extra_cflags), _as_list(extra_cuda_cflags),
                          _as_list(extra_ldflags), _as_list(extra_include_paths)])
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


@dataclass
class InlineBuild:
    """The arguments of one `load_inline` call, resolved to values."""

    name: str
    cpp_sources: list[str]
    cuda_sources: list[str] = field(default_factory=list)
    functions: list[str] | dict[str, str] | None = None
    extra_cflags: list[str] = field(default_factory=list)
    extra_cuda_cflags: list[str] = field(default_factory=list)
    extra_ldflags: list[str] = field(default_factory=list)
    extra_include_paths: list[str] = field(default_factory=list)
    line: int = 0

    @property
    def key(self) -> str:
        return inline_key(self.cpp_sources, self.cuda_sources, self.functions, self.extra_cflags,
                          self.extra_cuda_cflags, self.extra_ldflags, self.extra_include_paths)

    def host_source(self, module_name: str) -> str:
        """main.cpp as torch's load_inline writes it: torch/extension.h, sources, bindings."""
        parts = ["#include <torch/extension.h>", *self.cpp_sources]
        funcs = self.functions
        if funcs:
            items = funcs.items() if isinstance(funcs, dict) else ((f, f) for f in funcs)
            defs = "\n".join(f'  m.def("{f}", torch::wrap_pybind_function({f}), "{doc}");'
                             for f, doc in items)
            parts.append(f"PYBIND11_MODULE({module_name}, m) {{\n{defs}\n}}")
        return "\n".join(parts) + "\n"

    def device_source(self, prelude: str) -> str:
        """cuda.cu as torch's load_inline writes it: light torch header, CUDA headers, sources."""
        return prelude + "\n".join(self.cuda_sources) + "\n"


class _Resolver:
    def __init__(self, tree: ast.Module) -> None:
        self.names: dict[str, Any] = {}
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(
                    node.targets[0], ast.Name):
                try:
                    self.names[node.targets[0].id] = self.value(node.value)
                except ValueError:
                    self.names.pop(node.targets[0].id, None)

    def value(self, node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, bool)):
            return node.value
        if isinstance(node, ast.Constant) and node.value is None:
            return None
        if isinstance(node, ast.Name) and node.id in self.names:
            return self.names[node.id]
        if isinstance(node, (ast.List, ast.Tuple)):
            return [self.value(e) for e in node.elts]
        if isinstance(node, ast.Dict):
            return {self.value(k): self.value(v) for k, v in zip(node.keys, node.values,
                                                                 strict=True) if k is not None}
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self.value(node.left) + self.value(node.right)
        if isinstance(node, ast.JoinedStr) and all(isinstance(v, ast.Constant)
                                                   for v in node.values):
            return "".join(str(v.value) for v in node.values)  # type: ignore[attr-defined]
        raise ValueError(f"cannot resolve {ast.dump(node)[:80]}")


def find_inline_builds(source: str) -> tuple[list[InlineBuild], list[str]]:
    """Resolved `load_inline` calls of a candidate, and notes on calls that could not be."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return [], [f"syntax error: {exc}"]
    resolver = _Resolver(tree)
    builds: list[InlineBuild] = []
    notes: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func
        fname = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
        if fname != "load_inline":
            continue
        args: dict[str, Any] = {}
        try:
            for i, arg in enumerate(node.args):
                args[_ARG_ORDER[i]] = resolver.value(arg)
            for kw in node.keywords:
                if kw.arg in _ARG_ORDER:
                    args[kw.arg] = resolver.value(kw.value)
        except (ValueError, IndexError, TypeError) as exc:
            notes.append(f"line {node.lineno}: load_inline arguments not static ({exc}); "
                         "built at run time")
            continue
        funcs = args.get("functions")
        builds.append(InlineBuild(
            name=str(args.get("name", "ext")), cpp_sources=_as_list(args.get("cpp_sources")),
            cuda_sources=_as_list(args.get("cuda_sources")),
            functions=funcs if isinstance(funcs, dict) or funcs is None else _as_list(funcs),
            extra_cflags=_as_list(args.get("extra_cflags")),
            extra_cuda_cflags=_as_list(args.get("extra_cuda_cflags")),
            extra_ldflags=_as_list(args.get("extra_ldflags")),
            extra_include_paths=_as_list(args.get("extra_include_paths")), line=node.lineno))
    return builds, notes
