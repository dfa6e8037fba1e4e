"""Extract one nn.Module class from a source file into a standalone KernelBench-style module.

The class becomes `Model`; the transitive closure of what it needs from its file (helpers,
constants, other classes, imports of torch/math/typing/...) comes along, nothing else. Names
imported from other files of the same repository are inlined when a resolver can find them,
else the class is rejected naming the missing name. A transformers-style `config` constructor
argument is replaced by a small concrete `ModelConfig` built from the config class's defaults.

Analysis uses `ast` (fast, for the closure); the rewrite of the assembled text uses libcst.
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst

from pipeline.tasks.carve.closure import (
    BUILTINS,
    MODULE_BASES,
    REJECT_BASES,
    Collector,
    ExtractError,
    FileInfo,
    Resolver,
    parse_file,
    root_name,
    strip_decorator,
)
from pipeline.tasks.carve.config_standin import config_defaults, config_source, small_config
from pipeline.tasks.carve.shims import SHIMS
from pipeline.tasks.normalize.normalize import NormalizeError, normalize_source
from verifier import pyast


@dataclass
class Param:
    name: str
    annotation: str = ""
    has_default: bool = False
    default: str = ""


@dataclass
class Extraction:
    """A standalone module text defining `Model` (no get_inputs yet) and what is known of it."""

    source: str
    original_name: str
    init_params: list[Param]
    forward_params: list[Param]
    config: dict[str, object] | None = None
    config_class: str = ""
    included: list[str] = field(default_factory=list)
    inlined: list[str] = field(default_factory=list)
    shims: list[str] = field(default_factory=list)
    normalized: list[str] = field(default_factory=list)  # einops patterns rewritten to torch


def package_resolver(root: str | Path, package: str = "transformers") -> Resolver:
    """Resolve imports inside an installed package (relative or absolute) to its files."""
    root = Path(root)

    def resolve(importer: str, module: str, level: int) -> tuple[str, str] | None:
        rel = _package_relpath(importer, package)
        if level:
            base = list(Path(rel).parent.parts)
            if level > 1:
                base = base[: len(base) - (level - 1)] if level - 1 <= len(base) else None
            if base is None:
                return None
            parts = base + (module.split(".") if module else [])
        elif module.split(".")[0] == package:
            parts = module.split(".")[1:]
        else:
            return None
        for cand in (root.joinpath(*parts).with_suffix(".py"),
                     root.joinpath(*parts, "__init__.py")):
            if cand.is_file():
                try:
                    return str(cand.relative_to(root)), cand.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError):
                    return None
        return None

    return resolve


def _package_relpath(path: str, package: str) -> str:
    parts = Path(path).parts
    if package in parts:
        return str(Path(*parts[len(parts) - parts[::-1].index(package):]))
    return path


# --- rewrite (libcst) -------------------------------------------------------------------------


class _Rewrite(cst.CSTTransformer):
    """Rename the class to Model, fix super(), drop foreign decorators, bases and annotations."""

    def __init__(self, original: str, strip_decorators: set[str], known: set[str],
                 config_param: str | None):
        self.original = original
        self.strip_decorators = strip_decorators
        self.known = known
        self.config_param = config_param
        self.class_stack: list[str] = []
        self.func_depth = 0

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.class_stack.append(node.name.value)

    def leave_ClassDef(self, original: cst.ClassDef, updated: cst.ClassDef) -> cst.ClassDef:
        self.class_stack.pop()
        bases = []
        for arg in updated.bases:
            root = _cst_root(arg.value)
            if root in MODULE_BASES:
                arg = arg.with_changes(value=cst.parse_expression("nn.Module"))
            bases.append(arg)
        decorators = [d for d in updated.decorators
                      if _cst_root(d.decorator) not in self.strip_decorators]
        return updated.with_changes(bases=bases, decorators=decorators)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.func_depth += 1

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef
                          ) -> cst.FunctionDef:
        self.func_depth -= 1
        decorators = [d for d in updated.decorators
                      if _cst_root(d.decorator) not in self.strip_decorators]
        updated = updated.with_changes(decorators=decorators)
        if updated.returns is not None and not self._annotation_ok(updated.returns.annotation):
            updated = updated.with_changes(returns=None)
        in_model = bool(self.class_stack) and self.class_stack[-1] in ("Model", self.original)
        if in_model and updated.name.value == "forward":
            updated = _split_position_embeddings(updated)
        if in_model and updated.name.value == "__init__" and self.config_param:
            params = updated.params
            kept = [p for p in params.params if p.name.value != self.config_param]
            if kept and isinstance(params.star_arg, cst.MaybeSentinel) and not params.kwonly_params:
                kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            updated = updated.with_changes(params=params.with_changes(params=kept))
            body = list(updated.body.body)
            at = 1 if body and _is_docstring(body[0]) else 0
            body.insert(at, cst.parse_statement(f"{self.config_param} = ModelConfig()"))
            updated = updated.with_changes(body=updated.body.with_changes(body=body))
        return updated

    def leave_Param(self, original: cst.Param, updated: cst.Param) -> cst.Param:
        if updated.annotation is not None and not self._annotation_ok(
                updated.annotation.annotation):
            return updated.with_changes(annotation=None)
        return updated

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.Name:
        if updated.value == self.original:
            return updated.with_changes(value="Model")
        return updated

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if isinstance(updated.func, cst.Name) and updated.func.value == "super" and updated.args:
            return updated.with_changes(args=[])
        return updated

    def _annotation_ok(self, expr: cst.BaseExpression) -> bool:
        names = {n.value for n in _cst_names(expr)}
        return all(n in self.known or n in BUILTINS for n in names)


def _split_position_embeddings(fn: cst.FunctionDef) -> cst.FunctionDef:
    """`position_embeddings=(cos, sin)` becomes two tensor arguments, so inputs stay tensors."""
    params = list(fn.params.params)
    names = [p.name.value for p in params]
    if "position_embeddings" not in names or "cos" in names or "sin" in names:
        return fn
    param = params[names.index("position_embeddings")]
    ann = cst.Module([]).code_for_node(param.annotation.annotation) if param.annotation else ""
    body = cst.Module([]).code_for_node(fn.body)
    if not re.search(r"\btuple\b|\bTuple\b", ann) and not re.search(
            r"=\s*position_embeddings\b", body):
        return fn  # a positional-embedding tensor (DETR), not rotary (cos, sin)
    params = [p for p in params if p.name.value != "position_embeddings"]
    at = 0
    while at < len(params) and params[at].default is None:
        at += 1
    comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    new = [cst.Param(cst.Name("cos"), comma=comma), cst.Param(cst.Name("sin"), comma=comma)]
    params = [p.with_changes(comma=comma) for p in params[:at]] + new + params[at:]
    if isinstance(fn.params.star_kwarg, cst.MaybeSentinel) and isinstance(
            fn.params.star_arg, cst.MaybeSentinel) and not fn.params.kwonly_params:
        params[-1] = params[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    body = list(fn.body.body)
    at_body = 1 if body and _is_docstring(body[0]) else 0
    body.insert(at_body, cst.parse_statement("position_embeddings = (cos, sin)"))
    return fn.with_changes(params=fn.params.with_changes(params=params),
                           body=fn.body.with_changes(body=body))


def _cst_names(expr: cst.CSTNode) -> list[cst.Name]:
    out: list[cst.Name] = []

    class V(cst.CSTVisitor):
        def visit_Name(self, node: cst.Name) -> None:
            out.append(node)

        def visit_Attribute(self, node: cst.Attribute) -> bool:
            root = node
            while isinstance(root, cst.Attribute):
                root = root.value
            if isinstance(root, cst.Name):
                out.append(root)
            return False

        def visit_SimpleString(self, node: cst.SimpleString) -> None:
            try:  # string annotations: check their names too
                parsed = pyast.parse(node.evaluated_value, mode="eval")
            except (SyntaxError, ValueError):
                return
            out.extend(cst.Name(n.id) for n in ast.walk(parsed) if isinstance(n, ast.Name))

    expr.visit(V())
    return out


def _cst_root(expr: cst.BaseExpression) -> str:
    while True:
        if isinstance(expr, cst.Call):
            expr = expr.func
        elif isinstance(expr, cst.Attribute | cst.Subscript):
            expr = expr.value
        else:
            break
    return expr.value if isinstance(expr, cst.Name) else ""


def _is_docstring(stmt: cst.CSTNode) -> bool:
    return (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
            and isinstance(stmt.body[0], cst.Expr)
            and isinstance(stmt.body[0].value, cst.SimpleString | cst.ConcatenatedString))


# --- entry point ------------------------------------------------------------------------------


def _params(fn: ast.FunctionDef | None) -> list[Param]:
    if fn is None:
        return []
    args = fn.args
    pos = [*args.posonlyargs, *args.args][1:]
    n_def = len(args.defaults)
    out = []
    for i, a in enumerate(pos):
        has = i >= len(pos) - n_def
        default = ast.unparse(args.defaults[i - (len(pos) - n_def)]) if has else ""
        out.append(Param(a.arg, ast.unparse(a.annotation) if a.annotation else "", has, default))
    for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        out.append(Param(a.arg, ast.unparse(a.annotation) if a.annotation else "", d is not None,
                         ast.unparse(d) if d is not None else ""))
    return out


def _method(info: FileInfo, cls: ast.ClassDef, name: str, depth: int = 0
            ) -> ast.FunctionDef | None:
    for stmt in cls.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == name:
            return stmt
    for base in cls.bases:
        b = info.bindings.get(root_name(base))
        if b and b.kind == "def" and depth < 5:
            node = info.tree.body[b.index]
            if isinstance(node, ast.ClassDef):
                found = _method(info, node, name, depth + 1)
                if found is not None:
                    return found
    return None


def _is_module_class(info: FileInfo, cls: ast.ClassDef, depth: int = 0) -> bool:
    for base in cls.bases:
        text = ast.unparse(base)
        root = root_name(base)
        if root in MODULE_BASES or text.startswith(("nn.", "torch.nn.")) or text in (
                "Module", "Sequential", "ModuleList"):
            return True
        b = info.bindings.get(root)
        if b and b.kind == "def" and depth < 6:
            node = info.tree.body[b.index]
            if isinstance(node, ast.ClassDef) and _is_module_class(info, node, depth + 1):
                return True
        if b and b.kind == "from" and b.module.split(".")[0] == "torch":
            return True
    return False


def _has_torch_base(info: FileInfo, cls: ast.ClassDef, depth: int = 0) -> bool:
    """True when forward comes from a torch.nn class (e.g. a subclass of nn.Conv2d)."""
    for base in cls.bases:
        text = ast.unparse(base)
        if text.startswith(("nn.", "torch.nn.")) and text not in ("nn.Module", "torch.nn.Module"):
            return True
        b = info.bindings.get(root_name(base))
        if b and b.kind == "def" and depth < 6:
            node = info.tree.body[b.index]
            if isinstance(node, ast.ClassDef) and _has_torch_base(info, node, depth + 1):
                return True
    return False


def _config_fields(text: str, param: str) -> list[str]:
    fields = re.findall(rf"\b{re.escape(param)}\.([A-Za-z_]\w*)", text)
    fields += re.findall(rf"getattr\(\s*{re.escape(param)}\s*,\s*[\"'](\w+)[\"']", text)
    return sorted(set(fields) - {"get"})


def extract_class(code: str, class_name: str, path: str = "<file>",
                  resolver: Resolver | None = None) -> Extraction:
    """Standalone source for `class_name` of `code`, renamed `Model`; raises ExtractError."""
    try:
        info = parse_file(path, code)
    except (SyntaxError, ValueError) as exc:
        raise ExtractError("syntax_error", f"{path}: {exc}") from None
    b = info.bindings.get(class_name)
    if b is None or b.kind != "def" or not isinstance(info.tree.body[b.index], ast.ClassDef):
        raise ExtractError("class_not_found", f"no top-level class {class_name} in {path}")
    cls = info.tree.body[b.index]
    bad = [root_name(x) for x in cls.bases if root_name(x) in REJECT_BASES
           or root_name(x).endswith("PreTrainedModel")]
    if bad:
        raise ExtractError("pretrained_model", f"{class_name} derives from {bad[0]}")
    if not _is_module_class(info, cls):
        raise ExtractError("not_module", f"{class_name} is not an nn.Module subclass")
    collector = Collector(resolver)
    collector.need(info, class_name, 0, path)
    closure = collector.closure
    init_fn = _method(info, cls, "__init__")
    fwd_fn = _method(info, cls, "forward")
    inherited_forward = False
    if fwd_fn is None:
        if not _has_torch_base(info, cls):
            raise ExtractError("no_forward", f"{class_name} has no forward()")
        inherited_forward = True
    init_params = _params(init_fn)
    config_param = None
    config_name = ""
    for p in init_params:
        if p.name == "config" or (p.name.endswith("_config") and not p.has_default) or \
                p.annotation.split(
                "|")[0].strip().strip("'\"").endswith("Config"):
            config_param = p.name
            config_name = p.annotation.split("|")[0].strip().strip("'\"")
            break
    parts: list[str] = []
    for path_i, idx in closure.stmts:
        finfo = collector.files[path_i]
        node = finfo.tree.body[idx]
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        parts.append("".join(finfo.lines[first - 1: node.end_lineno]).rstrip() + "\n")
    body_text = "\n\n".join(parts)
    config_values = None
    subs: dict[str, list[str]] = {}
    if config_param:
        fields = _config_fields(body_text, config_param)
        if not fields and "config" in body_text:
            fields = _config_fields(body_text, "config")
        defaults: dict[str, object] = {}
        ref = config_name or (closure.config_refs[0][1] if closure.config_refs else "")
        if not ref:
            ref = _guess_config_class(info, class_name)
        if ref:
            defaults = config_defaults(info, ref, resolver)
        config_values = small_config(defaults, fields)
        config_name = config_name or ref
        for sub, attr in re.findall(rf"\b{re.escape(config_param)}\.(\w+_config)\.(\w+)",
                                    body_text):
            subs.setdefault(sub, []).append(attr)
    header = ["import torch", "import torch.nn as nn"] + [
        i for i in closure.imports if i not in ("import torch", "import torch.nn as nn")]
    if any(i == "from torch import nn" for i in header):
        header.remove("import torch.nn as nn")
    text = "\n".join(header) + "\n\n\n"
    if closure.definitions:
        text += "\n\n\n".join(closure.definitions.values()) + "\n\n\n"
    if closure.shims:
        text += "\n\n\n".join(SHIMS[s] for s in closure.shims) + "\n\n\n"
    if config_values is not None:
        text += config_source(config_name or "the config", config_values, subs) + "\n\n"
    text += body_text
    known = set(BUILTINS) | set(collector.defined) | set(closure.shims) | set(
        closure.definitions) | {"ModelConfig", "Model", "torch", "nn"}
    for line in header:
        known.update(_import_names(line))
    strip: set[str] = set()
    for finfo in collector.files.values():
        strip |= {n for n in _all_decorator_roots(finfo) if strip_decorator(finfo, ast.Name(n))}
    try:
        module = cst.parse_module(text)
        module = module.visit(_Rewrite(class_name, strip, known, config_param))
        out = module.code
    except cst.ParserSyntaxError as exc:
        raise ExtractError("syntax_error", f"rewritten {class_name}: {exc}") from None
    try:
        out, normalized = normalize_source(out)
    except NormalizeError as exc:
        raise ExtractError(exc.reason, f"{class_name}: {exc.detail}") from None
    fwd_params = [Param("input")] if inherited_forward else _params(fwd_fn)
    out_tree = pyast.parse(out)
    model_node = next((n for n in out_tree.body if isinstance(n, ast.ClassDef)
                       and n.name == "Model"), None)
    if model_node is not None:
        own = next((n for n in model_node.body if isinstance(n, ast.FunctionDef)
                    and n.name == "forward"), None)
        if own is not None:
            fwd_params = _params(own)
    init_rest = [p for p in init_params if p.name != config_param]
    return Extraction(out, class_name, init_rest, fwd_params, config_values, config_name,
                      [f"{p}:{i}" for p, i in closure.stmts], closure.inlined, closure.shims,
                      normalized)


def _guess_config_class(info: FileInfo, class_name: str) -> str:
    """The file's config import sharing the longest prefix with the class name."""
    names = [n for n in info.bindings if n.endswith("Config") and n[0].isupper()]

    def common(n: str) -> int:
        k = 0
        while k < min(len(n), len(class_name)) and n[k] == class_name[k]:
            k += 1
        return k

    return max(names, key=lambda n: (common(n), -len(n)), default="")


def _import_names(line: str) -> set[str]:
    node = pyast.parse(line).body[0]
    if isinstance(node, ast.Import):
        return {a.asname or a.name.split(".")[0] for a in node.names}
    if isinstance(node, ast.ImportFrom):
        return {a.asname or a.name for a in node.names}
    return set()


@functools.lru_cache(maxsize=64)
def _all_decorator_roots(info: FileInfo) -> frozenset[str]:
    roots = set()
    for node in ast.walk(info.tree):
        for d in getattr(node, "decorator_list", []):
            roots.add(root_name(d))
    return frozenset(roots)
