"""`ast.parse` and `ast.literal_eval` behind one process-wide lock; the dotted name of a node.

CPython 3.11 keeps the AST constructor's recursion depth in per-interpreter state and resets it
at the start of every parse. When a parse pauses mid-tree (a garbage collection runs a finalizer
that releases the GIL) and another thread parses meanwhile, the first one ends with
`SystemError: AST constructor recursion depth mismatch` (cpython gh-106905). The verifier collects
candidates' load_inline calls on a thread pool and flows run tasks on threads, so every parse in
our code goes through here.
"""

from __future__ import annotations

import ast
import threading
from typing import Any

# reentrant: a finalizer or gc callback that parses on the same thread must not deadlock
_PARSE = threading.RLock()


def parse(source: str | bytes, filename: str = "<unknown>", mode: str = "exec") -> ast.AST:
    """`ast.parse`, serialised across threads."""
    with _PARSE:
        return ast.parse(source, filename, mode)


def literal_eval(node_or_string: str | ast.AST) -> Any:
    """`ast.literal_eval`, serialised across threads when it has to parse a string."""
    if not isinstance(node_or_string, str):
        return ast.literal_eval(node_or_string)
    with _PARSE:
        return ast.literal_eval(node_or_string)


def dotted(node: ast.AST) -> str:
    """`a.b.c` for a chain of attributes on a name, "" for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""
