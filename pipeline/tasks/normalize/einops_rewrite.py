"""Rewrite every einops use of a carved task into plain torch, so the task imports torch alone.

Calls of `rearrange`, `reduce`, `repeat`, `pack`, `unpack`, `einsum`, `parse_shape` (any import
style: `from einops import rearrange as r`, `import einops`, `einops.rearrange`) and the layers
`Rearrange`/`Reduce` of `einops.layers.torch` become calls of generated torch functions (see
`einops_codegen`); their einops imports go. The pattern must be a string literal or a module
constant; anything else raises `NormalizeError` naming the call.
"""

from __future__ import annotations

import libcst as cst

from pipeline.tasks.normalize import einops_codegen as gen
from pipeline.tasks.normalize.errors import NormalizeError

SUPPORTED = ("rearrange", "reduce", "repeat", "pack", "unpack", "einsum", "parse_shape",
             "Rearrange", "Reduce")
_LAYER = {"Rearrange": "rearrange", "Reduce": "reduce"}


def _dotted(expr: cst.BaseExpression) -> str:
    if isinstance(expr, cst.Name):
        return expr.value
    if isinstance(expr, cst.Attribute):
        head = _dotted(expr.value)
        return f"{head}.{expr.attr.value}" if head else ""
    return ""


def _module_name(node: cst.BaseExpression) -> str:
    return _dotted(node) if node is not None else ""


class _Bindings(cst.CSTVisitor):
    """Names the module binds to einops: functions/layers and module aliases."""

    def __init__(self) -> None:
        self.funcs: dict[str, str] = {}  # local name -> einops api name
        self.modules: dict[str, str] = {}  # local name -> einops module path
        self.constants: dict[str, str] = {}  # top-level NAME = "literal"
        self.taken: set[str] = set()
        self.depth = 0

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            name = _dotted(alias.name)
            if name.split(".")[0] == "einops":
                local = alias.asname.name.value if alias.asname else name.split(".")[0]
                self.modules[local] = name if alias.asname else "einops"

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        module = _module_name(node.module)
        if node.relative or module.split(".")[0] != "einops":
            return
        if isinstance(node.names, cst.ImportStar):
            raise NormalizeError("einops_unsupported", f"from {module} import *")
        for alias in node.names:
            orig = alias.name.value
            local = alias.asname.name.value if alias.asname else orig
            if module == "einops.layers" and orig == "torch":
                self.modules[local] = "einops.layers.torch"
            elif module in ("einops", "einops.layers.torch"):
                self.funcs[local] = orig
            else:
                raise NormalizeError("unresolved_name", f"{module}.{orig}")

    def visit_Name(self, node: cst.Name) -> None:
        self.taken.add(node.value)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.depth += 1

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.depth -= 1

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.depth += 1

    def leave_ClassDef(self, node: cst.ClassDef) -> None:
        self.depth -= 1

    def visit_Assign(self, node: cst.Assign) -> None:
        value = _literal(node.value)
        if self.depth == 0 and value is not None and len(node.targets) == 1 and isinstance(
                node.targets[0].target, cst.Name):
            self.constants[node.targets[0].target.value] = value


def _literal(expr: cst.BaseExpression) -> str | None:
    if isinstance(expr, cst.SimpleString | cst.ConcatenatedString):
        value = expr.evaluated_value
        return value if isinstance(value, str) else None
    return None


class _Rewriter(cst.CSTTransformer):
    def __init__(self, bindings: _Bindings):
        self.b = bindings
        self.helpers: dict[tuple, str] = {}  # (kind, pattern, kwargs, reduction) -> name
        self.sources: list[str] = []
        self.uses_math = False
        self.rewritten: list[str] = []
        self.code = cst.Module([])

    def api(self, func: cst.BaseExpression) -> str:
        """The einops api name a call's function refers to, or ''."""
        if isinstance(func, cst.Name):
            return self.b.funcs.get(func.value, "")
        dotted = _dotted(func)
        if "." not in dotted:
            return ""
        head, _, attr = dotted.rpartition(".")
        root, _, rest = head.partition(".")
        if root not in self.b.modules:
            return ""
        full = ".".join(x for x in (self.b.modules[root], rest) if x)
        if full in ("einops", "einops.layers.torch"):
            return attr
        raise NormalizeError("unresolved_name", f"{full}.{attr}")

    def fresh(self, base: str) -> str:
        k = 1
        while f"{base}{k}" in self.b.taken:
            k += 1
        self.b.taken.add(f"{base}{k}")
        return f"{base}{k}"

    def _literal_pattern(self, expr: cst.BaseExpression) -> str | None:
        value = _literal(expr)
        if value is None and isinstance(expr, cst.Name):
            value = self.b.constants.get(expr.value)
        return value

    def pattern(self, call: cst.Call, expr: cst.BaseExpression | None, api: str) -> str:
        text = self.code.code_for_node(call)
        if expr is None:
            raise NormalizeError("einops_dynamic", f"{api} without a pattern: {text[:120]}")
        value = self._literal_pattern(expr)
        if value is None:
            raise NormalizeError("einops_dynamic",
                                 f"{text[:120]}: the pattern is not a string literal")
        return value

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        api = self.api(updated.func)
        if not api:
            return updated
        if api not in SUPPORTED:
            raise NormalizeError("unresolved_name", f"einops.{api}")
        try:
            return self._rewrite(updated, api)
        except gen.PatternError as exc:
            raise NormalizeError("einops_pattern",
                                 f"{self.code.code_for_node(original)[:120]}: {exc}") from None

    def _rewrite(self, call: cst.Call, api: str) -> cst.BaseExpression:
        pos = [a for a in call.args if a.keyword is None and not a.star]
        kw = {a.keyword.value: a for a in call.args if a.keyword is not None}
        if any(a.star for a in call.args) and api != "einsum":
            raise NormalizeError("einops_dynamic", f"{self.code.code_for_node(call)[:120]}: "
                                                   "*args/**kwargs in an einops call")
        if api == "einsum":
            *tensors, pat = [a for a in call.args if a.keyword is None]
            eq = gen.einsum_equation(self.pattern(call, pat.value, api))
            args = [cst.Arg(cst.SimpleString(repr(eq)))] + [
                t.with_changes(comma=cst.MaybeSentinel.DEFAULT) for t in tensors]
            self.rewritten.append(f"einsum:{eq}")
            return cst.Call(cst.parse_expression("torch.einsum"), _commas(args))
        if api in ("pack", "unpack", "parse_shape"):
            n_in = 2 if api == "unpack" else 1
            names = {"pack": ["tensors", "pattern"], "unpack": ["tensor", "packed_shapes",
                                                                "pattern"],
                     "parse_shape": ["x", "pattern"]}[api]
            args = _by_name(pos, kw, names)
            if api != "parse_shape" and args[-1] is not None and self._literal_pattern(
                    args[-1]) is None:  # pack_one(t, pattern): parse the pattern at run time
                make_any = (gen.runtime_pack_source if api == "pack"
                            else gen.runtime_unpack_source)
                name = self._helper((api, None), make_any, f"_{api}_", api == "unpack")
                return cst.Call(cst.Name(name), _commas([cst.Arg(a) for a in args]))
            pattern = self.pattern(call, args[-1], api)
            make = {"pack": gen.pack_source, "unpack": gen.unpack_source,
                    "parse_shape": gen.parse_shape_source}[api]
            name = self._helper((api, pattern), lambda n: make(n, pattern), f"_{api}_",
                                api == "unpack")
            return cst.Call(cst.Name(name), _commas([cst.Arg(a) for a in args[:n_in]]))
        kind = _LAYER.get(api, api)
        layer = api in _LAYER
        names = ["pattern", "reduction"] if layer else ["tensor", "pattern", "reduction"]
        if kind != "reduce":
            names = names[:-1]
        args = _by_name(pos, kw, names)
        if len(pos) > len(names):
            raise NormalizeError("einops_pattern", f"{self.code.code_for_node(call)[:120]}: "
                                                   "extra positional arguments")
        pattern = self.pattern(call, args[0 if layer else 1], api)
        reduction = None
        if kind == "reduce":
            reduction = _literal(args[-1]) if args[-1] is not None else None
            if reduction is None:
                raise NormalizeError("einops_dynamic", f"{self.code.code_for_node(call)[:120]}"
                                                       ": the reduction is not a string literal")
        axes = [k for k in kw if k not in names]
        key = (kind, pattern, tuple(axes), reduction)
        fname = self._helper(key, lambda n: gen.function_source(kind, n, pattern, axes,
                                                                reduction), f"_{kind}_")
        axis_args = [kw[k].with_changes(comma=cst.MaybeSentinel.DEFAULT) for k in axes]
        if layer:
            cname = self._layer(api, fname, pattern, axes, reduction)
            return cst.Call(cst.Name(cname), _commas(axis_args))
        tensor = args[0]
        if isinstance(tensor, cst.List | cst.Tuple | cst.ListComp | cst.GeneratorExp):
            tensor = cst.Call(cst.parse_expression("torch.stack"), [cst.Arg(tensor)])
        return cst.Call(cst.Name(fname), _commas([cst.Arg(tensor), *axis_args]))

    def _helper(self, key: tuple, make, base: str, math: bool = False) -> str:
        if key in self.helpers:
            return self.helpers[key]
        name = self.fresh(base)
        made = make(name)
        source, needs_math = made if isinstance(made, tuple) else (made, math)
        self.uses_math |= needs_math
        self.helpers[key] = name
        self.sources.append(source)
        self.rewritten.append(f"{key[0]}:{key[1] or 'pattern at run time'}")
        return name

    def _layer(self, api: str, fname: str, pattern: str, axes: list[str],
               reduction: str | None) -> str:
        key = ("layer", api, pattern, tuple(axes), reduction)
        if key in self.helpers:
            return self.helpers[key]
        name = self.fresh(f"_{api}")
        args = f"{pattern!r}" + (f", {reduction!r}" if reduction else "")
        init = "".join(f"        self.{a} = {a}\n" for a in axes)
        call = ", ".join(["x", *(f"{a}=self.{a}" for a in axes)])
        self.sources.append(
            f"class {name}(torch.nn.Module):\n"
            f'    """einops.layers.torch.{api}({args})."""\n\n'
            f"    def __init__(self{''.join(', ' + a for a in axes)}):\n"
            f"        super().__init__()\n{init}\n"
            f"    def forward(self, x):\n        return {fname}({call})\n")
        self.helpers[key] = name
        return name

    def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine,
                                  updated: cst.SimpleStatementLine
                                  ) -> cst.SimpleStatementLine | cst.RemovalSentinel:
        body = [s for s in updated.body if not _is_einops_import(s)]
        if len(body) == len(updated.body):
            return updated
        return updated.with_changes(body=body) if body else cst.RemovalSentinel.REMOVE


def _is_einops_import(stmt: cst.BaseSmallStatement) -> bool:
    if isinstance(stmt, cst.Import):
        return all(_dotted(a.name).split(".")[0] == "einops" for a in stmt.names)
    if isinstance(stmt, cst.ImportFrom) and not stmt.relative:
        return _module_name(stmt.module).split(".")[0] == "einops"
    return False


def _by_name(pos: list[cst.Arg], kw: dict[str, cst.Arg], names: list[str]
             ) -> list[cst.BaseExpression | None]:
    out: list[cst.BaseExpression | None] = []
    for i, n in enumerate(names):
        if i < len(pos):
            out.append(pos[i].value)
        elif n in kw:
            out.append(kw[n].value)
        else:
            out.append(None)
    return out


def _commas(args: list[cst.Arg]) -> list[cst.Arg]:
    sep = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    return [a.with_changes(comma=sep if i < len(args) - 1 else cst.MaybeSentinel.DEFAULT)
            for i, a in enumerate(args)]


class _Leftovers(cst.CSTVisitor):
    """einops names still read after the rewrite (passed as values, e.g. `map(rearrange, xs)`)."""

    def __init__(self, names: set[str]):
        self.names = names
        self.found: list[str] = []

    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)  # `x.rearrange` is an attribute, not the einops function
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:
        node.value.visit(self)  # keyword names (`f(reduce=True)`) are not reads
        return False

    def visit_Param(self, node: cst.Param) -> bool:
        if node.default is not None:
            node.default.visit(self)
        return False

    def visit_Name(self, node: cst.Name) -> None:
        if node.value in self.names:
            self.found.append(node.value)


def rewrite_einops(source: str) -> tuple[str, list[str]]:
    """(source with einops rewritten to torch, the patterns rewritten); raises NormalizeError."""
    if "einops" not in source:
        return source, []
    module = cst.parse_module(source)
    bindings = _Bindings()
    module.visit(bindings)
    if not bindings.funcs and not bindings.modules:
        return source, []
    rewriter = _Rewriter(bindings)
    rewriter.code = module
    module = module.visit(rewriter)
    left = _Leftovers(set(bindings.funcs) | set(bindings.modules))
    module.visit(left)
    if left.found:
        name = left.found[0]
        api = bindings.funcs.get(name) or bindings.modules.get(name, name)
        raise NormalizeError("einops_unsupported",
                             f"einops {api} used other than as a call with a pattern ({name})")
    if not rewriter.sources:
        return module.code, rewriter.rewritten
    return _insert_helpers(module, rewriter.sources, rewriter.uses_math), rewriter.rewritten


def _insert_helpers(module: cst.Module, sources: list[str], uses_math: bool) -> str:
    """The generated functions right after the module's imports (and `import math` if needed)."""
    body = list(module.body)
    at = 0
    for i, stmt in enumerate(body):
        if isinstance(stmt, cst.SimpleStatementLine) and all(
                isinstance(s, cst.Import | cst.ImportFrom) for s in stmt.body):
            at = i + 1
        elif i == 0 and isinstance(stmt, cst.SimpleStatementLine) and isinstance(
                stmt.body[0], cst.Expr):
            at = 1
        else:
            break
    has_math = any(isinstance(s, cst.Import) and any(
        _dotted(a.name) == "math" and a.asname is None for a in s.names)
        for stmt in body if isinstance(stmt, cst.SimpleStatementLine) for s in stmt.body)
    extra: list[cst.BaseStatement] = []
    if uses_math and not has_math:
        extra.append(cst.parse_statement("import math\n"))
    code = "\n\n".join(sources)
    helpers = list(cst.parse_module(code).body)
    helpers[0] = helpers[0].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
    tail = body[at:]
    if tail:
        tail[0] = tail[0].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
    return module.with_changes(body=body[:at] + extra + helpers + tail).code
