"""The size constants of a task file and where they live: module-level ints (`batch_size =
16384 * 4`), elements of int tuples (`input_shape[0]`) and `Model.__init__` int defaults
(`Model.img_size`); read and set in a loaded module's namespace, and the file's other top-level
assignments re-run so derived values follow (stdlib only: runs inside the sandbox).
"""

from __future__ import annotations

import ast
from collections.abc import Callable


def literal_int(node: ast.expr) -> int | None:
    """The value of an int literal or of arithmetic on int literals (`16384 * 4`), else None."""
    if isinstance(node, ast.Constant):
        return node.value if type(node.value) is int else None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        v = literal_int(node.operand)
        return None if v is None else -v
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult | ast.Add | ast.Sub
                                                  | ast.FloorDiv | ast.Pow | ast.LShift):
        a, b = literal_int(node.left), literal_int(node.right)
        if a is None or b is None or (isinstance(node.op, ast.Pow | ast.LShift) and b > 64):
            return None
        if isinstance(node.op, ast.FloorDiv) and b == 0:
            return None
        ops = {ast.Mult: lambda: a * b, ast.Add: lambda: a + b, ast.Sub: lambda: a - b,
               ast.FloorDiv: lambda: a // b, ast.Pow: lambda: a ** b, ast.LShift: lambda: a << b}
        return ops[type(node.op)]()
    return None


def int_constants(tree: ast.Module) -> dict[str, int]:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], literal_int(node.value)
            if isinstance(target, ast.Name) and value is not None:
                out[target.id] = value
    return out


def tie_partners(tree: ast.Module) -> dict[str, int]:
    """Ints that only ever scale together with an equal module constant: elements of int
    tuples (`input_shape = (32768,)`, key `input_shape[0]`) and int defaults of `Model.__init__`
    (`img_size=224`, key `Model.img_size`) that the file relies on when it passes no value."""
    out: dict[str, int] = {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Tuple)):
            for i, elt in enumerate(node.value.elts):
                value = literal_int(elt)
                if value is not None:
                    out[f"{node.targets[0].id}[{i}]"] = value
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "__init__":
                    args = fn.args
                    positional = [*args.posonlyargs, *args.args]
                    pairs = [*zip(positional[len(positional) - len(args.defaults):],
                                  args.defaults, strict=True),
                             *((a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults,
                                                      strict=True) if d is not None)]
                    for arg, default in pairs:
                        value = literal_int(default)
                        if value is not None:
                            out[f"Model.{arg.arg}"] = value
    return out


def get_slot(ns: dict, key: str) -> int | None:
    """The current value of a constant, tuple element (`name[i]`) or Model default (`Model.x`)."""
    if key.startswith("Model."):
        init, name = ns["Model"].__init__, key[6:]
        if name in (init.__kwdefaults__ or {}):
            return init.__kwdefaults__[name]
        code, defaults = init.__code__, init.__defaults__ or ()
        names = code.co_varnames[:code.co_argcount]
        idx = names.index(name) - (len(names) - len(defaults))
        return defaults[idx] if 0 <= idx < len(defaults) else None
    if key.endswith("]"):
        name, idx = key[:-1].split("[")
        value = ns.get(name)
        return value[int(idx)] if isinstance(value, tuple) and int(idx) < len(value) else None
    return ns.get(key)


def set_slot(ns: dict, key: str, value: int) -> None:
    """Set what `get_slot(ns, key)` reads."""
    if key.startswith("Model."):
        init, name = ns["Model"].__init__, key[6:]
        if name in (init.__kwdefaults__ or {}):
            init.__kwdefaults__ = {**init.__kwdefaults__, name: value}
            return
        code, defaults = init.__code__, list(init.__defaults__ or ())
        names = code.co_varnames[:code.co_argcount]
        defaults[names.index(name) - (len(names) - len(defaults))] = value
        init.__defaults__ = tuple(defaults)
    elif key.endswith("]"):
        name, idx = key[:-1].split("[")
        items = list(ns[name])
        items[int(idx)] = value
        ns[name] = tuple(items)
    else:
        ns[key] = value


def derived_refresher(tree: ast.Module, constants: dict[str, int] | set[str]
                      ) -> Callable[[dict], None]:
    """A function that re-runs the module's other top-level assignments in source order, so a
    value computed from a scaled constant (`bias_shape = (out_channels, 1, 1)`,
    `num_channels = embed_dim`) follows it: the data flow of the file, the constants pinned
    (names in `constants`, and the tuples that hold a `name[i]` key)."""
    constants = {k.split("[")[0] for k in constants}
    stmts = []
    for node in tree.body:
        if not isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if all(isinstance(t, ast.Name) and t.id in constants for t in targets):
            continue
        stmts.append(compile(ast.Module(body=[node], type_ignores=[]), "task.py", "exec"))

    def refresh(ns: dict) -> None:
        for code in stmts:
            exec(code, ns)

    return refresh


_SYNONYMS = {"img": "image", "imgs": "image", "chans": "channels", "ch": "channels",
             "chan": "channels", "feats": "features", "seq": "sequence", "len": "length"}
_GENERIC = {"size", "num", "n", "dim", "of", "model"}


def _words(key: str) -> set[str]:
    name = key.split("[")[0].removeprefix("Model.")
    return {_SYNONYMS.get(w, w) for w in name.lower().split("_") if w} - _GENERIC


def may_tie(constant: str, partner: str) -> bool:
    """Whether `partner` may scale together with the module constant `constant` when their
    values are equal: constants and tuple elements always (`batch_size` and `input_shape[0]`
    feed the same inputs), a `Model.__init__` default only when the names share a word
    (`image_size` and `Model.img_size`; not `kernel_size` and `Model.stride`, both 2 by
    chance, whose halving meta runs accept and the CPU run rejects)."""
    if not partner.startswith("Model."):
        return True
    return bool(_words(constant) & _words(partner))
