"""Other size sets and other constructor values of a KernelBench task file (stdlib only).

A kernel must read its sizes from the tensors and its constructor values from the module. The
generalisation check runs it against the same task at other sizes and other constructor
arguments. A task file keeps its sizes in module-level integer constants and its constructor
values in `get_init_inputs()` (or module-level floats it reads), so rewriting those literals gives
the other task; the pipeline's task probe checks that the reference still runs there before a
variant is kept (`pipeline.tasks.probe.variants`).

Integer constructor arguments that name an axis (`dim`, `axis`, `reduce_dim`: a small int the
module keeps and reduces or normalises over) get their own kind, "args": another axis, offered
as several proposals (dim+1, dim-1, ...) since only the probe knows which the reference accepts.

A variant is `{"label": "sizes" | "init" | "args", "source": str, "changes": {name: [old, new]}}`:
the changes name what moved, so a failure can say which size or constructor value was hard-coded.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable

from verifier import pyast

# change names of literal constructor arguments: the `Model.__init__` parameter they bind to,
# else their position `get_init_inputs()[i]`
INIT = "get_init_inputs()"
INPUTS = "get_inputs()"  # change names of sizes written inline in get_inputs: get_inputs()#k
AXIS_ARG = re.compile(r"(dim|axis)|.*_(dim|axis)")  # constructor ints that name an axis
AXIS_STEPS = (1, -1, 2, -2)  # other axes tried, in order, relative to the task's


def _literal_edits(tree: ast.Module, ints: Callable[[int], int], floats: Callable[[float], float],
                   inline: bool = False, axes: Callable[[int], int] | None = None
                   ) -> list[tuple[int, int, int, str, str, int | float, int | float]]:
    """(line, col, end col, new text, name, old, new) for top-level int/float constants, int
    literals in get_inputs when `inline` (`get_inputs()#k`), float literals in get_init_inputs
    (named by the constructor parameter they bind to, else `get_init_inputs()[i]`) and, mapped by
    `axes`, the axis-naming int constructor arguments (`axis_args`)."""
    edits = []

    def edit(node: ast.Constant, name: str, new: int | float) -> None:
        if node.lineno == node.end_lineno and new != node.value:
            text = str(new) if isinstance(new, int) else repr(new)
            edits.append((node.lineno, node.col_offset, node.end_col_offset, text, name,
                          node.value, new))

    for stmt in tree.body:
        if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name) and isinstance(stmt.value, ast.Constant)):
            v, name = stmt.value.value, stmt.targets[0].id
            if isinstance(v, bool):
                continue
            if isinstance(v, int):
                edit(stmt.value, name, ints(v))
            elif isinstance(v, float):
                edit(stmt.value, name, floats(v))
        if inline and isinstance(stmt, ast.FunctionDef) and stmt.name == "get_inputs":
            # shapes written inline (generated tasks): `get_inputs()#k`, k-th int in the body
            found = sorted((n for n in ast.walk(stmt) if isinstance(n, ast.Constant)
                            and type(n.value) is int), key=lambda n: (n.lineno, n.col_offset))
            for i, node in enumerate(found):
                edit(node, f"{INPUTS}#{i}", ints(node.value))
        if isinstance(stmt, ast.FunctionDef) and stmt.name == "get_init_inputs":
            found = sorted((n for n in ast.walk(stmt) if isinstance(n, ast.Constant)
                            and isinstance(n.value, float)),
                           key=lambda n: (n.lineno, n.col_offset))
            names = _init_names(tree, stmt, found)
            for i, node in enumerate(found):
                edit(node, names.get(id(node), f"{INIT}[{i}]"), floats(node.value))
    if axes is not None:
        for name, node in axis_args(tree):
            edit(node, name, axes(node.value))
    return edits


def axis_args(tree: ast.Module) -> list[tuple[str, ast.Constant]]:
    """(name, literal) of the int constructor arguments that name an axis: an item of the list
    `get_init_inputs` returns that binds to an `__init__` parameter called `dim`/`axis`/`*_dim`,
    as an int literal or as a module-level constant of that name, with a value in -8..7."""
    init = next((f for c in tree.body if isinstance(c, ast.ClassDef) and c.name == "Model"
                 for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
    fn = next((f for f in tree.body if isinstance(f, ast.FunctionDef)
               and f.name == "get_init_inputs"), None)
    ret = None if fn is None else next((r for r in ast.walk(fn) if isinstance(r, ast.Return)),
                                       None)
    if init is None or ret is None or not isinstance(ret.value, ast.List | ast.Tuple):
        return []
    params = [a.arg for a in [*init.args.posonlyargs, *init.args.args][1:]]
    consts = {s.targets[0].id: s.value for s in tree.body if isinstance(s, ast.Assign)
              and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name)
              and isinstance(s.value, ast.Constant)}
    out = []
    for param, item in zip(params, ret.value.elts, strict=False):
        name, node = param, item
        if isinstance(item, ast.Name) and item.id in consts:
            name, node = item.id, consts[item.id]
        elif name in consts:
            continue  # the parameter's name is a module constant's: a change could not say which
        if (isinstance(node, ast.Constant) and type(node.value) is int
                and -8 <= node.value < 8 and AXIS_ARG.fullmatch(name)):
            out.append((name, node))
    return out


def _init_names(tree: ast.Module, fn: ast.FunctionDef, found: list[ast.Constant]
                ) -> dict[int, str]:
    """id(literal) -> the `Model.__init__` parameter it binds to, for literals that are whole
    items of the list `get_init_inputs` returns (`return [64, 0.7]` with `__init__(self, dim,
    temperature)`: the 0.7 is `temperature`), so feedback names the argument, not a position.
    A name a module-level constant already has, or a literal nested deeper, keeps its position."""
    init = next((f for c in tree.body if isinstance(c, ast.ClassDef) and c.name == "Model"
                 for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
    ret = next((r for r in ast.walk(fn) if isinstance(r, ast.Return)), None)
    if init is None or ret is None or not isinstance(ret.value, ast.List | ast.Tuple):
        return {}
    params = [a.arg for a in [*init.args.posonlyargs, *init.args.args][1:]]
    taken = {t.id for stmt in tree.body if isinstance(stmt, ast.Assign)
             for t in stmt.targets if isinstance(t, ast.Name)}
    out = {}
    ids = {id(n) for n in found}
    for pos, item in enumerate(ret.value.elts):
        if id(item) in ids and pos < len(params) and params[pos] not in taken:
            out[id(item)] = params[pos]
    return out


def rewrite(source: str, ints: Callable[[int], int], floats: Callable[[float], float],
            inline: bool = False, axes: Callable[[int], int] | None = None
            ) -> tuple[str, dict[str, list[int | float]]]:
    """The task file with module-level sizes mapped by `ints`, constructor floats by `floats`
    and axis arguments by `axes`, and what changed ({name: [old, new]})."""
    lines = source.splitlines(keepends=True)
    edits = _literal_edits(pyast.parse(source), ints, floats, inline, axes)
    for line, col, end, text, *_ in sorted(edits, reverse=True):
        raw = lines[line - 1].encode()  # ast columns count UTF-8 bytes
        lines[line - 1] = (raw[:col] + text.encode() + raw[end:]).decode()
    changes = {name: [old, new] for *_, name, old, new in sorted(edits)}
    return "".join(lines), changes


def rewrite_literals(source: str, ints: Callable[[int], int],
                     floats: Callable[[float], float]) -> str:
    """The task file with module-level sizes mapped by `ints` and constructor floats by `floats`."""
    return rewrite(source, ints, floats)[0]


def shrink(value: int, factor: int) -> int:
    """A size divided by `factor`, kept at 8 or more (small structural values untouched)."""
    return value if value < 8 else max(8, value // factor)


def other_size(value: int) -> int:
    """A different size with the same divisibility by 4 (3/4 of it), for sizes of 8 or more."""
    return value if value < 8 else value - value // 4


def half_size(value: int) -> int:
    """Half a size of 16 or more (the fallback when 3/4 breaks a divisibility the task needs)."""
    return value if value < 16 else value // 2


def other_scalar(value: float) -> float:
    """A different constructor float of the same sign and magnitude."""
    return value * 1.25 if value else 0.0


def other_sizes(source: str) -> str:
    """The task at another size set and other constructor floats (the source if it has none)."""
    try:
        return rewrite_literals(source, other_size, other_scalar)
    except SyntaxError:
        return source


def _same(v: float) -> float:
    return v


def derive(source: str) -> list[list[dict]]:
    """Candidate variants of a task, grouped: each group is one kind ("sizes", "init") in order
    of preference; a caller keeps the first of a group whose reference runs. [] for groups with
    nothing to change (no module-level size of 8 or more, no constructor float)."""
    try:
        pyast.parse(source)
    except SyntaxError:
        return []
    groups = []
    sizes = []
    for fn in (other_size, half_size):
        text, changes = rewrite(source, fn, _same, inline=True)
        if changes and all(v["source"] != text for v in sizes):
            sizes.append({"label": "sizes", "source": text, "changes": changes})
    if sizes:
        groups.append(sizes)
    text, changes = rewrite(source, lambda v: v, other_scalar)
    if changes:
        groups.append([{"label": "init", "source": text, "changes": changes}])
    for name, node in axis_args(pyast.parse(source)):
        old = node.value
        groups.append([{"label": "args", "source": single_change(source, name, old + step),
                        "changes": {name: [old, old + step]}} for step in AXIS_STEPS])
    return groups


def first_of_each(source: str) -> list[dict]:
    """One variant per kind without validation (the first candidate of each group)."""
    return [g[0] for g in derive(source)]


def apply_changes(source: str, changes: dict[str, list[int | float]]) -> str:
    """The task with each named literal (whose value is still the change's old one) set to the
    change's new value: a variant rebuilt from its `changes` alone."""
    for name, (old, new) in changes.items():
        edits = [e for e in _literal_edits(pyast.parse(source), lambda v: v + 1,
                                           lambda v: v + 1.0, True, lambda v: v + 1)
                 if e[4] == name and e[5] == old]
        if not edits:
            raise ValueError(f"variant change {name} {old} -> {new}: no such literal in the task")
        source = single_change(source, name, new)
    return source


def single_change(source: str, name: str, new: int | float) -> str:
    """The task with only `name` (a module constant, a constructor parameter whose literal
    `get_init_inputs` passes, or `get_init_inputs()[i]`) set to `new`."""
    tree = pyast.parse(source)
    edits = [e for e in _literal_edits(tree, lambda v: v + 1, lambda v: v + 1.0, True,
                                       lambda v: v + 1)
             if e[4] == name]
    if not edits:
        return source
    line, col, end, *_ = edits[0]
    lines = source.splitlines(keepends=True)
    raw = lines[line - 1].encode()
    text = str(new) if isinstance(new, int) and not isinstance(new, bool) else repr(new)
    lines[line - 1] = (raw[:col] + text.encode() + raw[end:]).decode()
    return "".join(lines)


def describe(variant: dict) -> str:
    """`batch_size 16 -> 12, dim 256 -> 192` for a variant's changes."""
    return ", ".join(f"{k} {_num(a)} -> {_num(b)}" for k, (a, b) in variant["changes"].items())


def _num(v: int | float) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)
