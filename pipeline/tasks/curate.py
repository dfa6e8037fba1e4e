"""Curation of tasks: exact and near dedup, decontamination against named benchmarks.

- exact: hash of the AST with user identifiers renamed in order of appearance, numbers zeroed,
  docstrings dropped (so the same computation at other sizes or names is one task);
- near: MinHash LSH (datasketch) over n-grams of that normalized token stream;
- decontamination: against fingerprint indexes (`pipeline.tasks.kernelbench_index`; KernelBench
  levels 1-4 ship with the package and are on by default, folders in `decontaminate_against` get
  the same treatment): n-gram overlap, aten op sequence, AST op signature. A match removes the
  task (`contaminated`), unless the task is one generic op: then it is kept as `overlap:<file>`.
"""

from __future__ import annotations

import ast
import builtins
import functools
import hashlib
import io
import tokenize
from pathlib import Path

from datasketch import MinHash, MinHashLSH

from pipeline.config import TasksConfig
from pipeline.tasks.kernelbench_index import (
    FingerprintIndex,
    Match,
    match_task,
    resolve_indexes,
)
from schemas import Rejection, Task, content_hash
from verifier import pyast

STAGE = "curate"
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


_PERM = 128


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


def _minhash(grams: set[str], num_perm: int = _PERM) -> MinHash:
    m = MinHash(num_perm=num_perm, seed=1)
    m.update_batch([g.encode("utf-8") for g in grams])
    return m


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


# --- the stage ---------------------------------------------------------------------------------


def _drop(t: Task, ref: str, reason: str, detail: str) -> Rejection:
    """A curate rejection keyed by the module (so a re-run skips it) naming the task."""
    return Rejection.make(STAGE, t.module_id or t.task_id, ref, reason,
                          f"task {t.task_id} ({t.name}): {detail}")


def contamination(task: Task, indexes: list[FingerprintIndex], cfg: TasksConfig
                  ) -> Match | None:
    """The first benchmark overlap of `task` (see `pipeline.tasks.kernelbench_index`)."""
    shapes = [list(s.shape) for s in task.input_specs]
    for index in indexes:
        found = match_task(task.source, task.op_inventory, shapes, index, cfg.decontam_threshold)
        if found is not None:
            return found
    return None


def curate_tasks(tasks: list[Task], cfg: TasksConfig, existing: list[Task],
                 benchmark_dir: Path | None = None) -> tuple[list[Task], list[Rejection]]:
    """Dedup (against `existing` too) and decontaminate; every dropped task gets a Rejection.

    A task overlapping a benchmark only through one generic op is kept, marked `overlap:<file>`
    (unless `decontaminate_generic: reject`); `benchmark_dir` holds fetched indexes."""
    rejections: list[Rejection] = []
    indexes = resolve_indexes(cfg.decontaminate_against, cfg.ngram, benchmark_dir)
    # LSH proposes candidates (its banding needs a threshold below ~0.95); the estimated
    # Jaccard similarity then decides against the configured threshold
    lsh = MinHashLSH(threshold=min(cfg.near_dup_threshold, 0.9), num_perm=_PERM)
    hashes: dict[str, MinHash] = {}
    opsets: dict[str, frozenset[str]] = {}
    exact: dict[str, str] = {}
    for t in existing:
        try:
            exact.setdefault(exact_hash(t.source), t.task_id)
            key = f"old:{t.task_id}"
            if key not in hashes:
                hashes[key] = _minhash(computation_ngrams(t.source, cfg.ngram))
                opsets[key] = frozenset(t.op_inventory)
                lsh.insert(key, hashes[key])
        except (SyntaxError, ValueError, RecursionError):
            continue
    kept: list[Task] = []
    for pos, t in enumerate(tasks):
        ref = t.path or t.name
        if cfg.max_tasks is not None and len(kept) + len(existing) >= cfg.max_tasks:
            rejections.extend(_drop(u, u.path or u.name, "max_tasks",
                                    f"over max_tasks={cfg.max_tasks}") for u in tasks[pos:])
            break
        try:
            h = exact_hash(t.source)
        except (SyntaxError, ValueError, RecursionError) as exc:
            rejections.append(_drop(t, ref, "unparsable",
                                             f"{ref}: {exc}"))
            continue
        if h in exact:
            rejections.append(_drop(t, ref, "duplicate",
                                             f"{ref}: same normalized AST as task {exact[h]}"))
            continue
        mh = _minhash(computation_ngrams(t.source, cfg.ngram))
        ops = frozenset(t.op_inventory)
        # similar text is a near-duplicate only when it also runs the same aten ops: the
        # one-token difference between two activation files is a different kernel
        near = [k for k in lsh.query(mh) if hashes[k].jaccard(mh) >= cfg.near_dup_threshold
                and (not ops or not opsets[k] or ops == opsets[k])]
        if near:
            other = sorted(near)[0].split(":", 1)[1]
            rejections.append(_drop(t, ref, "near_duplicate",
                                             f"{ref}: near-duplicate of task {other}"))
            continue
        match = contamination(t, indexes, cfg)
        if match is not None and (not match.generic or cfg.decontaminate_generic == "reject"):
            rejections.append(_drop(t, f"{match.benchmark}/{match.entry}", "contaminated",
                                    f"{ref}: {match.describe()}"))
            continue
        exact[h] = t.task_id
        hashes[f"new:{t.task_id}"] = mh
        opsets[f"new:{t.task_id}"] = ops
        lsh.insert(f"new:{t.task_id}", mh)
        t.dedup_cluster = hashlib.sha256(h.encode()).hexdigest()[:12]
        t.decontamination = (f"overlap:{match.benchmark}/{match.entry}" if match is not None
                             else "clean")
        kept.append(t)
    return kept, rejections
