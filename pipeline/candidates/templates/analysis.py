"""Understand a task: its ATen graph (traced in a sandbox) and its reference source text.

Imports only torch-free stdlib plus `verifier.isolation.sandbox` (stdlib), so the template generator runs
on a GPU node that has nothing but torch and the repository.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.candidates.templates.specialized import resolve_specialized
from pipeline.candidates.templates.symbolic import Scalar, decode
from verifier import pyast
from verifier.isolation.sandbox import SandboxLimits, run_sandboxed
from verifier.judge.variants import other_sizes

_PROBE = Path(__file__).with_name("probe.py")


class NoTemplate(Exception):
    """No template family covers this task; the message says why (reported, never faked)."""


@dataclass
class Node:
    """One ATen graph node as traced by `probe.py`."""

    name: str
    op: str  # placeholder | call_function | output
    target: str  # e.g. aten.addmm, aten.sum.dim_IntList, getitem
    args: list
    named: dict
    meta: dict | list | None
    users: list[str]

    @property
    def base(self) -> str:
        """Target without the `aten.` prefix and overload: `sum`, `addmm`, `relu_`."""
        return self.target.removeprefix("aten.").split(".")[0]

    @property
    def overload(self) -> str:
        parts = self.target.removeprefix("aten.").split(".")
        return parts[1] if len(parts) > 1 else "default"

    def a(self, name: str, default=None):
        """A schema argument by name (defaults filled in by the probe)."""
        return self.named.get(name, default)

    @property
    def shape(self) -> list[int]:
        if not isinstance(self.meta, dict):
            raise NoTemplate(f"node {self.name} ({self.target}) has no single tensor output")
        return list(self.meta["shape"])

    @property
    def dtype(self) -> str:
        return self.meta["dtype"] if isinstance(self.meta, dict) else "float32"


@dataclass
class Graph:
    """The traced reference: parameters/buffers (by dotted name), inputs, nodes in order."""

    params: list[str]
    nodes: list[Node]
    num_inputs: int
    training: bool = True
    by_name: dict[str, Node] = field(default_factory=dict)
    # size symbol -> (placeholder node name, dim) it is read from, or the module attribute
    # (`self.gn.num_groups`) holding it; empty for a fixed-size trace
    symbols: dict[str, tuple[str, int] | str] = field(default_factory=dict)
    # `self.dim` -> 1: the module's int attributes, so a reduction can read its axis at run time
    int_attrs: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.by_name = {n.name: n for n in self.nodes}

    def placeholders(self) -> list[Node]:
        return [n for n in self.nodes if n.op == "placeholder"]

    def outputs(self) -> list:
        out = next(n for n in self.nodes if n.op == "output")
        value = out.args[0]
        return value if isinstance(value, list) else [value]

    def live_nodes(self) -> list[Node]:
        """Call nodes that the outputs depend on, in graph order (dead code dropped)."""
        live: set[str] = set()
        stack = [r["node"] for r in _refs(self.outputs())]
        while stack:
            name = stack.pop()
            if name in live:
                continue
            live.add(name)
            stack.extend(r["node"] for r in _refs(self.by_name[name].args))
        return [n for n in self.nodes if n.name in live and n.op == "call_function"]


def _refs(value) -> list[dict]:
    if isinstance(value, dict) and "node" in value:
        return [value]
    if isinstance(value, list):
        return [r for v in value for r in _refs(v)]
    return []


def refs(value) -> list[str]:
    """Names of the graph nodes referenced in an encoded argument."""
    return [r["node"] for r in _refs(value)]


_CACHE: dict[str, Graph] = {}
_FAILED: dict[str, str] = {}  # source hash -> why it could not be traced


def _symbols(p: dict) -> dict[str, tuple[str, int] | str]:
    """Where each size symbol can be read: forward inputs first, then parameters/buffers."""
    places = [d for d in p["nodes"] if d["op"] == "placeholder"]
    k = len(p["params"])
    out: dict[str, tuple[str, int] | str] = {}
    for d in places[k:] + places[:k]:
        if not isinstance(d["meta"], dict):
            continue
        for j, s in enumerate(d["meta"]["shape"]):
            if isinstance(s, dict) and re.fullmatch(r"s\d+", s["sym"]) and s["sym"] not in out:
                out[s["sym"]] = (d["name"], j)
    return out


def _graph(p: dict) -> Graph:
    if not p.get("ok"):
        raise NoTemplate(f"reference could not be traced: {p.get('reason', 'unknown')}")
    symbols = _symbols(p)
    if isinstance(p.get("other"), dict) and p["other"].get("ok"):
        resolve_specialized(p, p["other"], symbols)
    known = set(symbols)
    nodes = [Node(**{k: decode(d[k], known) for k in ("name", "op", "target", "args", "named",
                                                      "meta", "users")}) for d in p["nodes"]]
    by_name = {n.name: n for n in nodes}
    for sc in p.get("scalars", []):
        node = by_name.get(sc["node"])
        if node is not None and isinstance(node.named.get(sc["arg"]), float):
            node.named[sc["arg"]] = Scalar(node.named[sc["arg"]], sc["attr"])
    return Graph(params=p["params"], nodes=nodes, num_inputs=p["num_inputs"],
                 training=p.get("training", True), symbols=symbols,
                 int_attrs=dict(p.get("int_attrs") or {}))


def trace_sources(sources: list[str], *, timeout_s: float = 600.0) -> dict[str, Graph | str]:
    """Trace many sources in one sandboxed child (one torch import); fills the cache.

    Returns source hash -> Graph, or the reason it could not be traced.
    """
    keys = [hashlib.sha256(s.encode()).hexdigest() for s in sources]
    todo = [s for s, k in zip(sources, keys, strict=True) if k not in _CACHE]
    out: dict[str, Graph | str] = {}
    if todo:
        res = run_sandboxed([sys.executable, str(_PROBE)],
                            limits=SandboxLimits(timeout_s=timeout_s, memory_mb=8192),
                            input_files={"tasks.json": json.dumps([[s, other_sizes(s)]
                                                                   for s in todo])})
        batch = (res.payload or {}).get("batch")
        if batch is None:
            raise NoTemplate(f"batch trace failed: {res.describe_failure()}")
        for src, p in zip(todo, batch, strict=True):
            key = hashlib.sha256(src.encode()).hexdigest()
            try:
                _CACHE[key] = _graph(p)
            except NoTemplate as exc:
                _FAILED[key] = str(exc)
    for k in keys:
        out[k] = _CACHE.get(k) or _FAILED.get(k, "not traced")
    return out


def trace_source(source: str, *, timeout_s: float = 120.0) -> Graph:
    """Trace a KernelBench source to an ATen graph in a sandboxed child; raise NoTemplate."""
    key = hashlib.sha256(source.encode()).hexdigest()
    if key in _CACHE:
        return _CACHE[key]
    if key in _FAILED:
        raise NoTemplate(_FAILED[key])
    res = run_sandboxed([sys.executable, str(_PROBE)],
                        limits=SandboxLimits(timeout_s=timeout_s, memory_mb=8192),
                        input_files={"task.py": source, "task_other.py": other_sizes(source)})
    if res.payload is None:
        raise NoTemplate(f"reference could not be traced: {res.describe_failure()}")
    try:
        graph = _graph(res.payload)
    except NoTemplate as exc:
        _FAILED[key] = str(exc)
        raise
    _CACHE[key] = graph
    return graph


@dataclass
class Reference:
    """What the candidate file copies from the reference source: imports, constants, init."""

    preamble: str  # imports, simple module-level constants, helper classes/functions
    init_source: str  # `def __init__(...)` of Model, super() call normalised
    forward_args: list[str]  # forward's parameter names after self
    forward_signature: str  # the text between the parentheses of `def forward(`


def read_reference(source: str) -> Reference:
    """Parse the reference file: the candidate reuses its constructor verbatim."""
    tree = pyast.parse(source)
    model = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"),
                 None)
    if model is None:
        raise NoTemplate("no class Model in the reference")
    init = next((n for n in model.body if isinstance(n, ast.FunctionDef)
                 and n.name == "__init__"), None)
    fwd = next((n for n in model.body if isinstance(n, ast.FunctionDef)
                and n.name == "forward"), None)
    if fwd is None:
        raise NoTemplate("Model has no forward")
    pre = []
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            pre.append(ast.unparse(node))
        elif isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
            # constants, and tables a constructor reads (an activation registry)
            pre.append(ast.unparse(node))
        elif (isinstance(node, ast.ClassDef | ast.FunctionDef) and node.name not in (
                "Model", "get_inputs", "get_init_inputs")):
            # a config stand-in (`class ModelConfig`) or helper the constructor calls; the
            # candidate keeps it only when its own code reads the name (program._preamble)
            pre.append(ast.unparse(node))
    if init is None:
        init_src = "def __init__(self):\n    super().__init__()"
    else:
        init_node = _SuperFix().visit(pyast.parse(ast.unparse(init)))
        init_src = ast.unparse(init_node)
    if fwd.args.vararg or fwd.args.kwarg:
        raise NoTemplate("forward takes *args/**kwargs")
    args = [a.arg for a in fwd.args.posonlyargs + fwd.args.args][1:]
    sig_args = ast.unparse(fwd.args)
    return Reference("\n".join(pre), init_src, args, sig_args)


class _SuperFix(ast.NodeTransformer):
    """`super(Model, self).__init__()` -> `super().__init__()` so the copy works in ModelNew."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id == "super" and node.args:
            node.args = []
        return node


@dataclass
class TaskView:
    """The task fields templates need; built from a `schemas.Task` or straight from a file."""

    task_id: str
    name: str
    source: str
    cpu_source: str
    level: int = 1
    path: str = ""

    @classmethod
    def from_task(cls, task) -> TaskView:
        return cls(task.task_id, task.name, task.source, task.cpu_source or task.source,
                   task.level, task.path)

    @classmethod
    def from_file(cls, path: str | Path, cpu_source: str | None = None, level: int = 1
                  ) -> TaskView:
        p = Path(path)
        src = p.read_text(encoding="utf-8")
        tid = hashlib.sha256(ast.unparse(pyast.parse(src)).encode()).hexdigest()[:20]
        return cls(tid, p.stem, src, cpu_source or src, level, str(p))


def graph_summary(graph: Graph) -> str:
    """One line: the ATen ops of the live graph in order (for reasoning texts)."""
    return " -> ".join(n.target.removeprefix("aten.") for n in graph.live_nodes()
                       if n.target != "getitem")
