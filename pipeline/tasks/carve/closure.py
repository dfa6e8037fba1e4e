"""What a carved class needs from its file: the file's bindings (ast) and the transitive closure of
the names the class uses, with the rules for which imports a task file may keep."""

from __future__ import annotations

import ast
import builtins
import functools
from collections.abc import Callable
from dataclasses import dataclass, field

from pipeline.tasks.carve.repo_resolver import same_definition
from pipeline.tasks.carve.shims import SHIM_NEEDS, SHIMS
from pipeline.tasks.normalize.deps import absolute_module, dependency_definitions
from verifier import pyast

# Top-level modules a task file may import (the verifier has torch + stdlib only).
ALLOWED_MODULES = frozenset({
    "torch", "math", "typing", "typing_extensions", "collections", "functools", "itertools",
    "dataclasses", "enum", "numbers", "operator", "abc", "copy", "warnings", "__future__",
    "numpy", "einops", "random", "logging", "inspect", "contextlib", "types", "re",
})
BUILTINS = frozenset(dir(builtins)) | {"__name__", "__file__", "__class__"}

# Base classes that are nn.Module with extra machinery irrelevant to the computation.
MODULE_BASES = frozenset({"GradientCheckpointingLayer"})
REJECT_BASES = frozenset({"PreTrainedModel", "GenerationMixin", "PushToHubMixin",
                          "ModelHubMixin", "PyTorchModelHubMixin"})

_KEEP_DECORATORS = frozenset({"staticmethod", "classmethod", "property", "dataclass",
                              "torch", "functools", "lru_cache", "cache", "wraps"})

class ExtractError(Exception):
    """The class cannot become a standalone task; `reason` is a short class, `detail` one line."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail

# A resolver maps (importing file path, module as written, level) to (path, source) or None.
Resolver = Callable[[str, str, int], "tuple[str, str] | None"]
# --- file analysis (ast) ---------------------------------------------------------------------


@dataclass
class _Binding:
    kind: str  # def | import | from
    index: int  # statement index in the module body
    module: str = ""  # for imports
    level: int = 0
    orig: str = ""  # imported name


@dataclass(eq=False)
class FileInfo:
    path: str
    source: str
    tree: ast.Module
    lines: list[str]
    bindings: dict[str, _Binding]


@functools.lru_cache(maxsize=64)
def parse_file(path: str, source: str) -> FileInfo:
    tree = pyast.parse(source)
    bindings: dict[str, _Binding] = {}
    for i, node in enumerate(tree.body):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bindings[node.name] = _Binding("def", i)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        bindings.setdefault(n.id, _Binding("def", i))
        elif isinstance(node, ast.Import):
            for a in node.names:
                name = a.asname or a.name.split(".")[0]
                bindings[name] = _Binding("import", i, a.name if a.asname else name)
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                if a.name == "*":
                    continue
                bindings[a.asname or a.name] = _Binding("from", i, node.module or "", node.level,
                                                        a.name)
    return FileInfo(path, source, tree, source.splitlines(keepends=True), bindings)


class _FreeNames(ast.NodeVisitor):
    """Names a statement reads from module scope (annotations and docstrings excluded)."""

    def __init__(self, skip_decorator: Callable[[ast.expr], bool]):
        self.loads: list[str] = []
        self.skip_decorator = skip_decorator

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load) and node.id not in self.loads:
            self.loads.append(node.id)

    def _visit_args(self, args: ast.arguments) -> None:
        for d in [*args.defaults, *args.kw_defaults]:
            if d is not None:
                self.visit(d)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        for d in node.decorator_list:
            if not self.skip_decorator(d):
                self.visit(d)
        self._visit_args(node.args)
        for stmt in node.body:
            self.visit(stmt)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._visit_args(node.args)
        self.visit(node.body)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for d in node.decorator_list:
            if not self.skip_decorator(d):
                self.visit(d)
        for b in node.bases:
            self.visit(b)
        for stmt in node.body:
            self.visit(stmt)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)


def root_name(expr: ast.expr) -> str:
    while isinstance(expr, ast.Attribute | ast.Call | ast.Subscript):
        expr = expr.value if not isinstance(expr, ast.Call) else expr.func
    return expr.id if isinstance(expr, ast.Name) else ""


def _module_allowed(module: str) -> bool:
    return module.split(".")[0] in ALLOWED_MODULES


# --- closure ----------------------------------------------------------------------------------


@dataclass
class _Closure:
    stmts: list[tuple[str, int]] = field(default_factory=list)  # (path, index), dependency order
    imports: list[str] = field(default_factory=list)  # import lines of allowed modules
    shims: list[str] = field(default_factory=list)
    config_refs: list[tuple[str, str]] = field(default_factory=list)  # (path, class name)
    inlined: list[str] = field(default_factory=list)
    renames: dict[tuple[str, str], str] = field(default_factory=dict)
    definitions: dict[str, str] = field(default_factory=dict)  # timm blocks etc., in order


class Collector:
    def __init__(self, resolver: Resolver | None, max_inlined_lines: int = 600):
        self.resolver = resolver
        self.closure = _Closure()
        self.seen: set[tuple[str, str]] = set()
        self.defined: dict[str, tuple[str, int]] = {}  # output name -> origin
        self.inlined_lines = 0
        self.max_inlined_lines = max_inlined_lines
        self.files: dict[str, FileInfo] = {}

    def skip_decorator(self, info: FileInfo) -> Callable[[ast.expr], bool]:
        def skip(expr: ast.expr) -> bool:
            return strip_decorator(info, expr)

        return skip

    def need(self, info: FileInfo, name: str, depth: int, via: str) -> None:
        self.files.setdefault(info.path, info)
        key = (info.path, name)
        if key in self.seen or name in BUILTINS:
            return
        self.seen.add(key)
        b = info.bindings.get(name)
        if b is None:
            return  # a local/global the runtime will report if it is really missing
        if name in SHIMS and (b.kind != "def" or name == "logger"):
            if name not in self.closure.shims:
                self._shim_needs(name)
            return
        if b.kind == "def":
            node = info.tree.body[b.index]
            if (info.path, b.index) in self.closure.stmts:
                return
            owner = self.defined.get(name)
            if owner is not None and same_definition(
                    self.files[owner[0]].tree.body[owner[1]], node):
                return  # one helper copied into several files (`exists`, `default`)
            if isinstance(node, ast.ClassDef) and depth > 0:
                bad = [root_name(x) for x in node.bases if root_name(x) in REJECT_BASES]
                if bad:
                    raise ExtractError("pretrained_model", f"{name} derives from {bad[0]}")
            visitor = _FreeNames(self.skip_decorator(info))
            visitor.visit(node)
            for dep in visitor.loads:
                if dep != name:
                    self.need(info, dep, depth, via)
            if depth > 0:
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                self.inlined_lines += size
                if self.inlined_lines > self.max_inlined_lines:
                    raise ExtractError("too_many_dependencies",
                                       f"inlining {name} from {info.path} exceeds "
                                       f"{self.max_inlined_lines} lines")
                self.closure.inlined.append(f"{info.path}:{name}")
            owner = self.defined.get(name)
            if owner is not None and owner != (info.path, b.index):
                raise ExtractError("name_clash", f"{name} is defined in two inlined files")
            self.defined[name] = (info.path, b.index)
            self.closure.stmts.append((info.path, b.index))
            return
        self._need_import(info, name, b, depth, via)

    def _need_import(self, info: FileInfo, name: str, b: _Binding, depth: int, via: str
                     ) -> None:
        if b.kind == "import":
            if _module_allowed(b.module):
                line = (f"import {b.module} as {name}" if b.module != name else
                        f"import {b.module}")
                self._add_import(line)
                return
            raise ExtractError("unresolved_import", f"{name} (module {b.module}) in {via}")
        if b.level == 0 and _module_allowed(b.module):
            alias = f" as {name}" if b.orig != name else ""
            self._add_import(f"from {b.module} import {b.orig}{alias}")
            return
        if name in SHIMS:
            if name not in self.closure.shims:
                self._shim_needs(name)
            return
        defs = dependency_definitions(absolute_module(info.path, b.module, b.level), b.orig)
        if defs is not None:  # a torch building block of timm & co: its definition comes along
            for def_name, source in defs:
                self.closure.definitions.setdefault(def_name, source)
            if name != b.orig:
                self.closure.definitions.setdefault(name, f"{name} = {b.orig}")
            return
        if b.orig.endswith("Config"):
            self.closure.config_refs.append((info.path, b.orig))
            return
        if b.orig in MODULE_BASES:
            return
        if self.resolver is None or depth >= 8:  # re-exports through __init__ files are deep
            raise ExtractError("unresolved_name", f"{name} from {'.' * b.level}{b.module}")
        found = self.resolver(info.path, b.module, b.level)
        if found is None:
            raise ExtractError("unresolved_name", f"{name} from {'.' * b.level}{b.module}")
        other = parse_file(*found)
        if b.orig not in other.bindings:
            raise ExtractError("unresolved_name", f"{name} not found in {found[0]}")
        if b.orig != name:
            raise ExtractError("unresolved_name", f"{name} is an alias of {b.orig}")
        self.need(other, b.orig, depth + 1, f"{found[0]}")

    def _shim_needs(self, name: str) -> None:
        for dep in SHIM_NEEDS.get(name, ()):
            if dep in SHIMS:
                if dep not in self.closure.shims:
                    self._shim_needs(dep)
            else:
                self._add_import({"nn": "from torch import nn", "logging": "import logging",
                                  "contextlib": "import contextlib"}[dep])
        self.closure.shims.append(name)

    def _add_import(self, line: str) -> None:
        if line not in self.closure.imports:
            self.closure.imports.append(line)


def strip_decorator(info: FileInfo, expr: ast.expr) -> bool:
    """Decorators from outside torch/stdlib (hub kernels, docstrings, output capture) go."""
    root = root_name(expr)
    if root in _KEEP_DECORATORS:
        return False
    b = info.bindings.get(root)
    if b is None:
        return root not in BUILTINS
    if b.kind == "def":
        return False
    return not _module_allowed(b.module) or b.level > 0
