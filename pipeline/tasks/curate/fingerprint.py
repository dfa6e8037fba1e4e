"""Fingerprints of a task's source for dedup and decontamination: the normalized AST text
(identifiers renamed in order, numbers zeroed, docstrings and imports gone), its n-grams, the
n-grams of the computation alone, and the op-sequence signature of `Model`.

Curation (`curate.py`) and the benchmark indexes (`kernelbench_index.py`) both fingerprint with
these, so a task and a benchmark file are compared on the same terms.
"""

from __future__ import annotations

import ast
import builtins
import functools
import io
import tokenize

from verifier import pyast

_KEEP = frozenset(dir(builtins)) | {"self", "torch", "nn", "F", "math", "np", "Model",
                                    "get_inputs", "get_init_inputs", "super", "forward",
                                    "__init__"}


class _Canon(ast.NodeTransformer):
    """Rename bound identifiers (module names v0.., function locals a0.. per function), zero
    number literals, drop docstrings and annotations."""

    def __init__(self, bound: set[str]):
        self.bound = bound
        self.names: dict[str, str] = {}
        self.scopes: list[tuple[set[str], dict[str, str]]] = []

    def _n(self, name: str) -> str:
        if name in _KEEP:
            return name
        if self.scopes and name in self.scopes[-1][0]:
            local = self.scopes[-1][1]
            return local.setdefault(name, f"a{len(local)}")
        if name not in self.bound:
            return name
        return self.names.setdefault(name, f"v{len(self.names)}")

    def visit_Name(self, node: ast.Name) -> ast.Name:
        node.id = self._n(node.id)
        return node

    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.arg = self._n(node.arg)
        node.annotation = None
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.Attribute:
        self.generic_visit(node)
        if isinstance(node.value, ast.Name) and node.value.id == "self":
            node.attr = self._n(node.attr)
        return node

    def visit_keyword(self, node: ast.keyword) -> ast.keyword:
        self.generic_visit(node)
        return node

    def visit_Constant(self, node: ast.Constant) -> ast.Constant:
        if isinstance(node.value, int | float | complex) and not isinstance(node.value, bool):
            node.value = 0
        return node

    def _strip(self, node):
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]

    def visit_ClassDef(self, node: ast.ClassDef):
        node.name = self._n(node.name)
        self._strip(node)
        self.generic_visit(node)
        return node

    def visit_FunctionDef(self, node):
        if node.name not in _KEEP and not self.scopes:
            node.name = self._n(node.name)
        self._strip(node)
        node.returns = None
        local = {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}
        local |= {n.id for b in node.body for n in ast.walk(b)
                  if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        local.discard("self")
        self.scopes.append((local, {}))
        self.generic_visit(node)
        self.scopes.pop()
        return node

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_AnnAssign(self, node: ast.AnnAssign):
        self.generic_visit(node)
        if node.value is None:
            return None
        return ast.Assign(targets=[node.target], value=node.value, lineno=node.lineno)


def _bound_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
              and isinstance(node.value, ast.Name) and node.value.id == "self"):
            names.add(node.attr)
    return names


@functools.lru_cache(maxsize=4096)
def normalized_source(source: str) -> str:
    """Canonical text: identifiers renamed, numbers zeroed, docstrings/comments/imports gone."""
    tree = pyast.parse(source)
    tree.body = [n for n in tree.body if not isinstance(n, ast.Import | ast.ImportFrom)
                 and not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    tree = _Canon(_bound_names(tree)).visit(tree)
    ast.fix_missing_locations(tree)
    return ast.unparse(tree)


def exact_hash(source: str) -> str:
    """Content hash of the normalized source: one per computation, whatever its names."""
    from schemas import content_hash  # here, so `kernelsynth benchmarks` loads no pyarrow

    return content_hash(normalized_source(source))


def tokens(text: str) -> list[str]:
    out = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type in (tokenize.NAME, tokenize.OP, tokenize.NUMBER, tokenize.STRING):
                out.append(tok.string)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        out = text.split()
    return out


def ngrams(source: str, n: int, normalize: bool = True) -> set[str]:
    try:
        text = normalized_source(source) if normalize else source
    except (SyntaxError, ValueError, RecursionError):
        text = source
    toks = tokens(text)
    if len(toks) < n:
        return {" ".join(toks)} if toks else set()
    return {" ".join(toks[i:i + n]) for i in range(len(toks) - n + 1)}


_TEMPLATE = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x
"""


def computation_ngrams(source: str, n: int) -> set[str]:
    """N-grams of the computation only: no input functions, constants or template lines."""
    try:
        tree = pyast.parse(source)
        tree.body = [b for b in tree.body if isinstance(b, ast.ClassDef | ast.FunctionDef)
                     and b.name not in ("get_inputs", "get_init_inputs")]
        text = ast.unparse(tree)
    except (SyntaxError, ValueError, RecursionError):
        text = source
    return ngrams(text, n) - _template_grams(n)


@functools.lru_cache(maxsize=8)
def _template_grams(n: int) -> frozenset[str]:
    return frozenset(ngrams(_TEMPLATE, n))


# --- op-sequence signature --------------------------------------------------------------------

_ALIASES = {"linear": "linear", "conv2d": "conv2d", "matmul": "matmul", "mm": "matmul",
            "bmm": "matmul", "softmax": "softmax", "relu": "relu", "gelu": "gelu"}


def _call_name(func: ast.expr) -> str:
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return ""


def op_signature(source: str) -> tuple[str, ...]:
    """Layer types and calls of Model, in order: ('Conv2d', 'relu', 'max_pool2d')."""
    try:
        tree = pyast.parse(source)
    except (SyntaxError, ValueError):
        return ()
    model = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"),
                 None)
    if model is None:
        return ()
    layers: dict[str, str] = {}
    sig: list[str] = []
    for fn in model.body:
        if not isinstance(fn, ast.FunctionDef):
            continue
        if fn.name == "__init__":
            for node in ast.walk(fn):
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                    for t in node.targets:
                        if isinstance(t, ast.Attribute):
                            layers[t.attr] = _call_name(node.value.func)
        elif fn.name == "forward":
            calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call)]
            calls.sort(key=lambda c: (c.lineno, c.col_offset))
            for call in calls:
                name = _call_name(call.func)
                if (isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name)
                        and call.func.value.id == "self" and name in layers):
                    name = layers[name]
                if name and name not in ("super", "size", "view", "reshape", "contiguous",
                                         "dim", "shape", "float", "to"):
                    sig.append(_ALIASES.get(name.lower(), name.lower()))
    return tuple(sig)
