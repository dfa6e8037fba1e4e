"""Static rules on names the candidate's Python computes or aliases (issue 28, "Fallback outside
the traced calls"): what `getattr(torch, "re" + "lu")`, `C = torch._C; C.f()`,
`operator.attrgetter("nn.functional.relu")(torch)` and frame walks reach.

Decisions, per form:
- an attribute name that folds to a constant (`"re" + "lu"`, f-strings of constants, `"".join`,
  `chr`, module-level string constants) is judged as the attribute it names: an escape
  attribute (`sys`, `f_back`, `_getframe`, `__globals__`, ...) anywhere, torch compute in
  ModelNew's methods or the helpers they call (`torch_compute`), `torch._C` anywhere;
- a name that does not fold, on anything but `self` (nn.Module code does
  `getattr(self, f"conv{i}")`), is `computed_attr` anywhere: it could be any torch op or any
  module; `getattr` passed as a value and `operator.attrgetter`/`methodcaller` likewise;
- `torch._C` through any alias (`from torch import _C as c`, `C = torch._C`) is an escape: the
  dispatcher's state (`_len_torch_dispatch_stack`) tells a candidate when it is traced;
- `sys`, `os`, `inspect`, `gc`, `ctypes` used without importing them (handed over by a
  namespace) are escapes as if imported.
Every message names the line and the source text seen.
"""

from __future__ import annotations

import ast
from typing import Any

from verifier.checks.namespace import free_names
from verifier.pyast import dotted

# name -> what it is when the candidate does not bind it itself (KernelBench's conventions)
_DEFAULT_ALIASES = {"torch": "torch", "F": "torch.nn.functional", "nn": "torch.nn"}
_COMPUTE_HEADS = ("torch", "torch.nn.functional", "torch.special", "torch.linalg", "torch.fft")
_UNIMPORTED_ESCAPES = frozenset({"sys", "os", "inspect", "gc", "ctypes", "importlib",
                                 "subprocess", "builtins", "socket", "signal", "types"})
_GETTERS = frozenset({"operator.attrgetter", "operator.methodcaller"})


def _text(node: ast.AST, limit: int = 80) -> str:
    s = ast.unparse(node)
    return s if len(s) <= limit else s[:limit - 3] + "..."


def _finding(rule: str, node: ast.AST, message: str) -> dict[str, Any]:
    line = getattr(node, "lineno", None)
    return {"rule": rule, "message": f"line {line}: {_text(node)}: {message}", "line": line,
            "severity": "error"}


class Names:
    """String constants and import/assignment aliases of one candidate module."""

    def __init__(self, tree: ast.Module) -> None:
        self.consts: dict[str, str] = {}
        counts: dict[str, int] = {}
        for node in ast.walk(tree):
            for t in _targets(node):
                if isinstance(t, ast.Name):
                    counts[t.id] = counts.get(t.id, 0) + 1
        for node in tree.body:  # module-level names assigned a string once
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(
                    node.targets[0], ast.Name) and counts.get(node.targets[0].id) == 1:
                value = self.fold(node.value)
                if value is not None:
                    self.consts[node.targets[0].id] = value
        bound = {t.id for n in ast.walk(tree) for t in _targets(n) if isinstance(t, ast.Name)}
        # the candidate's own extensions (`ext = load_inline(...)`): their functions by name
        self.extensions = {dotted(t) for n in ast.walk(tree) if isinstance(n, ast.Assign)
                           and isinstance(n.value, ast.Call)
                           and dotted(n.value.func).split(".")[-1] in ("load_inline", "load")
                           for t in n.targets if dotted(t)}
        self.aliases = {k: v for k, v in _DEFAULT_ALIASES.items() if k not in bound}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        self.aliases[a.asname] = a.name
                    else:
                        root = a.name.split(".")[0]
                        self.aliases[root] = root
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        for _ in range(3):  # X = torch._C; Y = X; self.c = Y: a few rounds reach a fixpoint
            for node in ast.walk(tree):
                value = node.value if isinstance(node, ast.Assign | ast.NamedExpr) else None
                path = self.path(value) if value is not None else ""
                if path:
                    for t in _targets(node):
                        key = dotted(t)
                        if key:
                            self.aliases[key] = path

    def fold(self, node: ast.AST | None) -> str | None:
        """The string `node` always evaluates to, or None when it depends on run time."""
        if isinstance(node, ast.Constant):
            return node.value if isinstance(node.value, str) else None
        if isinstance(node, ast.Name):
            return self.consts.get(node.id)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self.fold(node.left), self.fold(node.right)
            return left + right if left is not None and right is not None else None
        if isinstance(node, ast.JoinedStr):
            parts = [self.fold(v.value if isinstance(v, ast.FormattedValue) else v)
                     for v in node.values]
            return "".join(parts) if all(p is not None for p in parts) else None  # type: ignore
        if isinstance(node, ast.Subscript):
            base = self.fold(node.value)
            if base is None:
                return None
            try:
                return base[ast.literal_eval(node.slice)] if not isinstance(
                    node.slice, ast.Slice) else base[slice(*(
                        ast.literal_eval(x) if x is not None else None
                        for x in (node.slice.lower, node.slice.upper, node.slice.step)))]
            except (ValueError, TypeError, IndexError):
                return None
        if isinstance(node, ast.Call):
            return self._fold_call(node)
        return None

    def _fold_call(self, node: ast.Call) -> str | None:
        func, args = node.func, node.args
        if isinstance(func, ast.Name) and func.id == "chr" and len(args) == 1 and isinstance(
                args[0], ast.Constant) and isinstance(args[0].value, int):
            return chr(args[0].value) if 0 <= args[0].value < 0x110000 else None
        if isinstance(func, ast.Name) and func.id == "str" and len(args) == 1:
            return self.fold(args[0])
        if not isinstance(func, ast.Attribute) or node.keywords:
            return None
        base = self.fold(func.value)
        if base is None:
            return None
        if func.attr == "join" and len(args) == 1 and isinstance(args[0], ast.List | ast.Tuple):
            parts = [self.fold(e) for e in args[0].elts]
            return base.join(parts) if all(p is not None for p in parts) else None  # type: ignore
        folded = [self.fold(a) for a in args]
        if any(f is None for f in folded):
            return None
        if func.attr in ("lower", "upper", "strip", "lstrip", "rstrip", "replace", "format",
                         "removeprefix", "removesuffix", "title", "capitalize", "swapcase"):
            try:
                return getattr(base, func.attr)(*folded)
            except (TypeError, ValueError, IndexError, KeyError):
                return None
        return None

    def path(self, node: ast.AST | None) -> str:
        """The module path an expression names through aliases and constant getattr
        (`C._len_torch_dispatch_stack` -> `torch._C._len_torch_dispatch_stack`), or ""."""
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id, "")
        if isinstance(node, ast.Attribute):
            if dotted(node) in self.aliases:
                return self.aliases[dotted(node)]
            base = self.path(node.value)
            return f"{base}.{node.attr}" if base else ""
        if isinstance(node, ast.Call) and dotted(node.func) == "getattr" and len(
                node.args) >= 2:
            base, name = self.path(node.args[0]), self.fold(node.args[1])
            return f"{base}.{name}" if base and name is not None else ""
        return ""


def _targets(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.Assign):
        return list(node.targets)
    if isinstance(node, ast.AnnAssign | ast.AugAssign | ast.NamedExpr):
        return [node.target]
    if isinstance(node, ast.For | ast.comprehension):
        return [n for n in ast.walk(node.target) if isinstance(n, ast.Name | ast.Attribute)]
    return []


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    return [f"{node.module}.{a.name}" for a in node.names] if node.module else []


def _hot_functions(tree: ast.Module, model_new: ast.ClassDef | None) -> dict[int, str]:
    """id(function) -> where it runs, for ModelNew's methods but __init__ and the module-level
    functions they call (transitively): the code a forward call executes."""
    if model_new is None:
        return {}
    helpers = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    hot = {id(f): f"ModelNew.{f.name}" for f in model_new.body
           if isinstance(f, ast.FunctionDef) and f.name != "__init__"}
    todo = [f for f in model_new.body if isinstance(f, ast.FunctionDef) and f.name != "__init__"]
    while todo:
        fn = todo.pop()
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id in helpers and id(helpers[node.func.id]) not in hot:
                helper = helpers[node.func.id]
                hot[id(helper)] = f"{helper.name}() (called from forward)"
                todo.append(helper)
    return hot


def _computes(path: str) -> bool:
    from verifier.checks.static_rules import torch_fn_computes

    if path.startswith("torch.ops.aten."):
        return torch_fn_computes(path.split(".")[3])
    head, _, last = path.rpartition(".")
    if head not in _COMPUTE_HEADS:
        return False
    return head not in ("torch", "torch.nn.functional") or torch_fn_computes(last)


def check_computed(tree: ast.Module, model_new: ast.ClassDef | None) -> list[dict[str, Any]]:
    """Findings on computed attribute names, getter functions and aliases (module docstring)."""
    try:
        return _check(tree, model_new)
    except RecursionError:  # a expression nested thousands deep: nothing honest looks like it
        return [{"rule": "computed_attr", "message": "the code nests too deeply for the static "
                 "checks to follow", "line": None, "severity": "error"}]


def _check(tree: ast.Module, model_new: ast.ClassDef | None) -> list[dict[str, Any]]:
    from verifier.checks.static_rules import ESCAPE_ATTRS, FOREIGN_ATTRS, INTROSPECTION

    names = Names(tree)
    hot = _hot_functions(tree, model_new)
    out: list[dict[str, Any]] = []
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    for name, _ in free_names(tree).items():
        if name in _UNIMPORTED_ESCAPES:
            node = next(n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == name)
            out.append(_finding("escape", node, f"uses `{name}` without importing it (the OS, "
                                "the interpreter or the harness)"))

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            visit(child, hot.get(id(child), where) if isinstance(
                child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) else where)
        if isinstance(node, ast.Name) and node.id == "getattr" and id(node) not in called:
            out.append(_finding("computed_attr", node, "getattr passed as a value (a lookup by "
                                "a string the static checks cannot follow)"))
        elif isinstance(node, ast.Import | ast.ImportFrom) and any(
                p.startswith("torch._C") for p in _imported(node)):
            out.append(_finding("escape", node, "imports torch._C (the dispatcher's and the "
                                "interpreter's internals)"))
        elif isinstance(node, ast.Attribute) and names.path(node) == "torch._C" and \
                dotted(node) != "torch._C":
            out.append(_finding("escape", node, "reaches torch._C through an alias (the "
                                "dispatcher's and the interpreter's internals)"))
        elif isinstance(node, ast.Attribute) and dotted(node) == "torch._C" and \
                id(node) not in called:
            out.append(_finding("escape", node, "reaches torch._C (the dispatcher's and the "
                                "interpreter's internals)"))
        elif isinstance(node, ast.Call):
            out.extend(_check_call(node, names, where,
                                   ESCAPE_ATTRS | INTROSPECTION | FOREIGN_ATTRS))

    visit(tree, "")
    return out


def _check_call(node: ast.Call, names: Names, where: str, escapes: frozenset[str]
                ) -> list[dict[str, Any]]:
    fn = dotted(node.func)
    full = names.path(node.func) or fn
    if full in _GETTERS:
        return [_finding("computed_attr", node, f"{full} looks attributes up by a string (a "
                         "lookup the static checks cannot follow)")]
    out = []
    if fn in ("getattr", "setattr", "delattr") and len(node.args) >= 2:
        obj, name = node.args[0], names.fold(node.args[1])
        own = dotted(obj).split(".")[0] == "self" or dotted(obj) in names.extensions
        base = names.path(obj)
        if name is None and not own and fn == "getattr":
            what = f"an attribute of {base}" if base else "an attribute"
            out.append(_finding("computed_attr", node, f"{what} chosen at run time (a hidden "
                                "library call or an escape the static checks cannot follow)"))
        elif name is not None and name in escapes and not (own and name == "modules"):
            out.append(_finding("escape", node, f"reaches .{name} (the OS, the interpreter or "
                                "the harness)"))
        elif name is not None and base and f"{base}.{name}".startswith("torch._C"):
            out.append(_finding("escape", node, f"reaches {base}.{name} (the dispatcher's and "
                                "the interpreter's internals)"))
        elif name is not None and base and where and fn == "getattr" and not isinstance(
                node.args[1], ast.Constant):  # a name spelled so that no rule reads it
            out.append(_finding("computed_attr", node, f"names {base}.{name} by a computed "
                                f"string in {where} (a hidden library call)"))
    aten = full.startswith("torch.ops.aten.")
    if where and (full != fn or aten) and _computes(full):  # via an alias, getattr, torch.ops
        out.append(_finding("torch_compute", node, f"calls {full}, which computes with torch "
                            f"in {where}"))
    return out
