"""Another size set and another set of constructor values for a KernelBench task file.

A template candidate must compute its sizes from the tensors and its constructor values from
the module; it is checked by running it against the same task at other sizes and arguments.
The task file keeps its sizes in module-level integer constants and its constructor arguments
in `get_init_inputs()`, so a rewrite of those literals is the other task.
"""

from __future__ import annotations

import ast
from collections.abc import Callable


def _literal_edits(tree: ast.Module, ints: Callable[[int], int], floats: Callable[[float], float]
                   ) -> list[tuple[int, int, int, str]]:
    """(line, col, end col, new text) for top-level int/float constants and init floats."""
    edits = []

    def edit(node: ast.Constant, text: str) -> None:
        if node.lineno == node.end_lineno:
            edits.append((node.lineno, node.col_offset, node.end_col_offset, text))

    for stmt in tree.body:
        if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name) and isinstance(stmt.value, ast.Constant)):
            v = stmt.value.value
            if isinstance(v, bool):
                continue
            if isinstance(v, int):
                edit(stmt.value, str(ints(v)))
            elif isinstance(v, float):
                edit(stmt.value, repr(floats(v)))
        if isinstance(stmt, ast.FunctionDef) and stmt.name == "get_init_inputs":
            for node in ast.walk(stmt):
                if (isinstance(node, ast.Constant) and isinstance(node.value, float)
                        and not isinstance(node.value, bool)):
                    edit(node, repr(floats(node.value)))
    return edits


def rewrite_literals(source: str, ints: Callable[[int], int],
                     floats: Callable[[float], float]) -> str:
    """The task file with module-level sizes mapped by `ints` and constructor floats by `floats`."""
    lines = source.splitlines(keepends=True)
    for line, col, end, text in sorted(_literal_edits(ast.parse(source), ints, floats),
                                       reverse=True):
        row = lines[line - 1]
        # ast columns count UTF-8 bytes
        raw = row.encode()
        lines[line - 1] = (raw[:col] + text.encode() + raw[end:]).decode()
    return "".join(lines)


def shrink(value: int, factor: int) -> int:
    """A size divided by `factor`, kept at 8 or more (small structural values untouched)."""
    return value if value < 8 else max(8, value // factor)


def other_size(value: int) -> int:
    """A different size with the same divisibility by 4 (3/4 of it), for sizes of 8 or more."""
    return value if value < 8 else value - value // 4


def other_scalar(value: float) -> float:
    """A different constructor float of the same sign and magnitude."""
    return value * 1.25 if value else 0.0


def other_sizes(source: str) -> str:
    """The task at another size set and other constructor floats (the source if it has none)."""
    try:
        return rewrite_literals(source, other_size, other_scalar)
    except SyntaxError:
        return source
