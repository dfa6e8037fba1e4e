"""Stage 1, extract: the candidate code from a raw response, parsed, with a matching `ModelNew`."""

from __future__ import annotations

import ast
import re

from verifier import pyast

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)


class FormatError(ValueError):
    """The response has no usable candidate; the message says what is missing."""


def extract_code(response: str) -> str:
    """The Python code of a response: the last fenced block defining ModelNew, or the whole text."""
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(response)]
    py = [b for lang, b in blocks if lang in ("", "python", "py", "python3")]
    with_model = [b for b in py if "class ModelNew" in b]
    if with_model:
        return with_model[-1]
    if py and "```" in response:
        return py[-1]
    return response


def _class(tree: ast.Module, name: str) -> ast.ClassDef | None:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    return None


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return None


def _arity(fn: ast.FunctionDef | None) -> tuple[int, int, bool]:
    """(required, total, variadic) positional parameters, self excluded."""
    if fn is None:
        return 0, 0, False
    args = fn.args.posonlyargs + fn.args.args
    total = len(args) - 1
    required = total - len(fn.args.defaults)
    return required, total, fn.args.vararg is not None


def check_candidate(code: str, task_source: str) -> ast.Module:
    """Parse `code`; ModelNew must exist with the reference's constructor and forward arity."""
    if not code.strip():
        raise FormatError("the response contains no code")
    try:
        tree = pyast.parse(code)
    except SyntaxError as exc:
        raise FormatError(f"syntax error at line {exc.lineno}: {exc.msg}") from None
    except ValueError as exc:
        raise FormatError(f"cannot parse the code: {exc}") from None
    except (RecursionError, MemoryError):  # the parser's nesting limits (30000 nested unary
        # operators overflow its stack as MemoryError): this candidate's error, not the batch's
        raise FormatError("cannot parse the code: it nests too deeply") from None
    new = _class(tree, "ModelNew")
    if new is None:
        raise FormatError("no top-level `class ModelNew` in the code")
    try:
        ref = _class(pyast.parse(task_source), "Model")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        ref = None
    if ref is None:
        return tree
    if _method(new, "forward") is None and _method(ref, "forward") is not None:
        raise FormatError("ModelNew has no forward method")
    for name in ("__init__", "forward"):
        r_req, r_tot, _ = _arity(_method(ref, name))
        n_req, n_tot, n_var = _arity(_method(new, name))
        if _method(new, name) is None and name == "__init__":
            if r_req:
                raise FormatError(f"ModelNew has no __init__ but Model takes {r_req} arguments")
            continue
        if n_req > r_tot or (n_tot < r_tot and not n_var):
            raise FormatError(
                f"ModelNew.{name} takes {n_req}..{n_tot} arguments, Model.{name} takes "
                f"{r_req}..{r_tot}: the signatures must match")
    return tree
