"""Plain-torch source for one einops call, from its literal pattern.

`rearrange`, `reduce` and `repeat` become a small function of the tensor and the axis lengths
given as keywords; every size is read from the tensor's shape at run time, so the function works
for any input size, not only the one a task was probed with. The recipe is einops' own:
split the input's axis groups (the ellipsis folded into one axis), permute, reduce or expand,
then merge into the output's groups. `pack`/`unpack`, `einsum` and `parse_shape` map onto
`torch.cat`/`split`, `torch.einsum` and a dict of the shape.
"""

from __future__ import annotations

import keyword
from dataclasses import dataclass, field

ELL = "…"  # the ellipsis as one axis name, as einops spells it internally
REDUCTIONS = {"sum": "sum", "mean": "mean", "max": "amax", "min": "amin", "prod": "prod",
              "any": "any", "all": "all"}
_CHAINED = {"prod", "any", "all"}  # torch reduces these over one dim at a time


class PatternError(ValueError):
    """The pattern is not one einops accepts, or not one a static rewrite can express."""


@dataclass
class _Side:
    """One side of a pattern: per tensor dim, its elementary axes (a name, a group, a unit)."""

    dims: list[tuple[tuple[str, ...], bool]]  # (axis names, written in parentheses)
    sizes: dict[str, int] = field(default_factory=dict)  # anonymous axes of a fixed length

    @property
    def axes(self) -> list[str]:
        return [a for names, _ in self.dims for a in names]


def parse_side(text: str, tag: str) -> _Side:
    """Parse one side of an einops pattern (`b (h d) ... 1`) into dims of elementary axes."""
    tokens = text.replace("...", f" {ELL} ").replace("(", " ( ").replace(")", " ) ").split()
    side = _Side([])
    group: list[str] | None = None
    for tok in tokens:
        if tok == "(":
            if group is not None:
                raise PatternError(f"nested parentheses in {text!r}")
            group = []
        elif tok == ")":
            if group is None:
                raise PatternError(f"unbalanced ')' in {text!r}")
            side.dims.append((tuple(group), True))
            group = None
        else:
            names: list[str] = []
            if tok.isdecimal():
                if int(tok) != 1:  # 1 is a unit axis: nothing inside a group, a dim outside
                    name = f"_{tag}{len(side.sizes)}_{tok}"
                    side.sizes[name] = int(tok)
                    names.append(name)
            elif tok == ELL or (tok.isidentifier() and not tok.startswith("_")
                                and not tok.endswith("_")):
                names.append(tok)
            else:
                raise PatternError(f"bad axis {tok!r} in {text!r}")
            if group is not None:
                group.extend(names)
            else:
                side.dims.append((tuple(names), False))
    if group is not None:
        raise PatternError(f"unbalanced '(' in {text!r}")
    seen = side.axes
    if len(seen) != len(set(seen)):
        raise PatternError(f"an axis repeats in {text!r}")
    return side


def _var(name: str) -> str:
    """A Python variable for an axis name (axis names never start or end with '_')."""
    if name == ELL:
        return "_e"
    return f"{name}_" if keyword.iskeyword(name) or name in ("torch", "math") else name


@dataclass
class _Gen:
    """Accumulates the body of one generated function."""

    x: str
    ell: str
    lines: list[str] = field(default_factory=list)
    size: dict[str, str] = field(default_factory=dict)  # axis -> size expression
    uses_math: bool = False

    def prod(self, names: tuple[str, ...] | list[str]) -> str:
        if not names:
            return "1"
        if ELL in names and not self.uses_math:
            self.uses_math = True
            self.lines.append(f"_e = math.prod({self.ell})")
        return " * ".join(self.size[n] for n in names)

    def reshape(self, shape: str) -> None:
        self.lines.append(f"{self.x} = {self.x}.reshape({_shape_arg(shape)})")

    def prod_each(self, axes: list[str]) -> str:
        return ", ".join(self.prod([a]) for a in axes)

    def shape_of(self, dims: list[tuple[tuple[str, ...], bool]], ell_split: bool) -> str:
        parts = []
        for names, grouped in dims:
            if names == (ELL,) and not grouped and ell_split:
                parts.append(f"*{self.ell}")
            else:
                parts.append(self.prod(names))
        return ", ".join(parts)


def _read_input(gen: _Gen, left: _Side, kwargs: list[str]) -> None:
    """`b, *ell, _d2 = x.shape` and the lengths of the axes inside groups."""
    targets, groups = [], []
    for k, (names, _) in enumerate(left.dims):
        if names == (ELL,):
            targets.append(f"*{gen.ell}")
        elif len(names) == 1 and names[0] not in left.sizes:
            targets.append(_var(names[0]))
            gen.size[names[0]] = _var(names[0])
        elif not names or (len(names) == 1 and names[0] in left.sizes):
            targets.append("_")
        else:
            targets.append(f"_d{k}")
            groups.append((k, names))
    if targets:
        lhs = targets[0] + "," if len(targets) == 1 else ", ".join(targets)
        gen.lines.append(f"{lhs} = {gen.x}.shape")
    for name, n in left.sizes.items():
        gen.size[name] = str(n)
    for name in kwargs:
        gen.size.setdefault(name, _var(name))
    for k, names in groups:
        unknown = [n for n in names if n not in gen.size]
        if len(unknown) > 1:
            raise PatternError(f"cannot infer the lengths of {', '.join(unknown)} in "
                               f"({' '.join(names)}): give all but one as keywords")
        if unknown:
            known = [n for n in names if n in gen.size]
            gen.lines.append(f"{_var(unknown[0])} = _d{k} // ({gen.prod(known)})"
                             if len(known) > 1 else
                             f"{_var(unknown[0])} = _d{k} // {gen.prod(known)}")
            gen.size[unknown[0]] = _var(unknown[0])
    if any(n == (ELL,) for n, _ in left.dims):
        gen.size[ELL] = "_e"


def _split_pattern(pattern: str) -> tuple[_Side, _Side]:
    if pattern.count("->") != 1:
        raise PatternError(f"{pattern!r} has no single '->'")
    lhs, rhs = pattern.split("->")
    left, right = parse_side(lhs, "l"), parse_side(rhs, "r")
    for side, name in ((left, "left"), (right, "right")):
        if sum(names.count(ELL) for names, _ in side.dims) > 1:
            raise PatternError(f"more than one ellipsis on the {name} of {pattern!r}")
    if any(ELL in names and grouped for names, grouped in left.dims):
        raise PatternError(f"ellipsis inside parentheses on the left of {pattern!r}")
    return left, right


def _shape_arg(shape: str) -> str:
    """Arguments of `reshape` for a shape text: `*ell` alone or nothing may be empty."""
    if not shape:
        return "()"
    return shape[1:] if shape.startswith("*") and "," not in shape else shape


def _dim_keys(side: _Side) -> list[tuple[tuple[str, ...], bool]]:
    """Dims compared for a no-op: `(h)` is `h`, but `(...)` is not `...`."""
    return [(names, grouped and ELL in names) for names, grouped in side.dims]


def _permute(gen: _Gen, order: list[str], target: list[str]) -> None:
    perm = [order.index(a) for a in target]
    if perm != list(range(len(perm))):
        gen.lines.append(f"{gen.x} = {gen.x}.permute({', '.join(map(str, perm))})")


def _tensor_name(names: list[str]) -> str:
    return next(n for n in ("x", "t", "tensor", "inp") if n not in names)


def function_source(kind: str, fname: str, pattern: str, kwargs: list[str],
                    reduction: str | None = None) -> tuple[str, bool]:
    """(source of `def fname(x, **kwargs)`, whether it needs `import math`) for one call."""
    left, right = _split_pattern(pattern)
    la, ra = left.axes, right.axes
    if {"torch", "math"} & set(kwargs):
        raise PatternError(f"{kind} {pattern!r}: an axis named torch or math")
    x = _tensor_name(la + ra + kwargs)
    gen = _Gen(x, "ell" if "ell" not in la + ra + kwargs else "ell_")
    if kind == "rearrange" and set(la) != set(ra):
        raise PatternError(f"rearrange {pattern!r}: axes differ between the sides")
    if kind == "reduce" and not set(ra) <= set(la):
        raise PatternError(f"reduce {pattern!r}: output axes missing on the left")
    if kind == "repeat" and not set(la) <= set(ra):
        raise PatternError(f"repeat {pattern!r}: input axes missing on the right")
    if right.sizes and kind != "repeat":
        raise PatternError(f"{kind} {pattern!r}: numbers other than 1 on the right")
    if left.sizes and kind == "rearrange":
        raise PatternError(f"rearrange {pattern!r}: numbers other than 1 on the left")
    _read_input(gen, left, kwargs)
    simple_left = all(len(n) == 1 and n != (ELL,) and n[0] not in left.sizes
                      for n, _ in left.dims)
    simple_right = all(len(n) == 1 and n != (ELL,) for n, _ in right.dims)
    if kind == "rearrange":
        perm = [la.index(a) for a in ra]
        if perm == list(range(len(perm))):  # a pure reshape: no permute between the reshapes
            if _dim_keys(left) != _dim_keys(right):
                gen.reshape(gen.shape_of(right.dims, True))
        else:
            if not simple_left:
                gen.reshape(gen.prod_each(la))
            _permute(gen, la, ra)
            if not simple_right:
                gen.reshape(gen.shape_of(right.dims, True))
    elif kind == "reduce":
        op = REDUCTIONS.get(reduction or "")
        if op is None:
            raise PatternError(f"reduce {pattern!r}: reduction {reduction!r} is not one of "
                               f"{', '.join(REDUCTIONS)}")
        if not simple_left:
            gen.reshape(gen.prod_each(la))
        dims = [i for i, a in enumerate(la) if a not in ra]
        if dims and reduction in _CHAINED:
            chain = "".join(f".{op}({d})" for d in reversed(dims))
            gen.lines.append(f"{x} = {x}{chain}")
        elif dims:
            arg = str(dims[0]) if len(dims) == 1 else f"({', '.join(map(str, dims))})"
            gen.lines.append(f"{x} = {x}.{op}(dim={arg})")
        kept = [a for a in la if a in ra]
        _permute(gen, kept, ra)
        if not simple_right:
            gen.reshape(gen.shape_of(right.dims, True))
    else:
        _repeat_body(gen, left, right, pattern, kwargs, simple_left, simple_right)
    last = gen.lines[-1] if gen.lines else ""
    if last.startswith(f"{x} = {x}."):
        gen.lines[-1] = "return " + last[len(f"{x} = "):]
    else:
        gen.lines.append(f"return {x}")
    params = ", ".join([x, *kwargs])
    body = "\n".join(f"    {line}" for line in gen.lines)
    doc = f'    """einops.{kind}({pattern!r}{", " + repr(reduction) if reduction else ""})."""'
    return f"def {fname}({params}):\n{doc}\n{body}\n", gen.uses_math


def _repeat_body(gen: _Gen, left: _Side, right: _Side, pattern: str, kwargs: list[str],
                 simple_left: bool, simple_right: bool) -> None:
    x, la, ra = gen.x, left.axes, right.axes
    new = [a for a in ra if a not in la]
    for a in new:
        if a in right.sizes:
            gen.size[a] = str(right.sizes[a])
        elif a not in gen.size:
            raise PatternError(f"repeat {pattern!r}: no length for the new axis {a}")
    kept = [a for a in ra if a in la]
    perm = [la.index(a) for a in kept]
    if perm != list(range(len(perm))):
        if not simple_left:
            gen.reshape(gen.prod_each(la))
        _permute(gen, la, kept)
        folded = True
    else:
        folded = simple_left
    if new or not folded:
        gen.reshape(", ".join("1" if a in new else gen.prod([a]) for a in ra))
    if new:
        gen.lines.append(f"{x} = {x}.expand("
                         f"{', '.join(gen.size[a] if a in new else '-1' for a in ra)})")
    if not simple_right:
        gen.reshape(gen.shape_of(right.dims, True))


def einsum_equation(pattern: str) -> str:
    """`'b h i d, b h j d -> b h i j'` (einops axis names) as a torch.einsum equation."""
    if pattern.count("->") != 1:
        raise PatternError(f"einsum {pattern!r} has no single '->'")
    lhs, rhs = pattern.split("->")
    if "(" in pattern or ")" in pattern:
        raise PatternError(f"einsum {pattern!r}: axis groups are not supported by einsum")
    operands = [op.replace("...", f" {ELL} ").split() for op in lhs.split(",")]
    out = rhs.replace("...", f" {ELL} ").split()
    names: list[str] = []
    for tok in [t for op in operands for t in op] + out:
        if tok != ELL and tok not in names:
            if not tok.isidentifier():
                raise PatternError(f"einsum {pattern!r}: bad axis {tok!r}")
            names.append(tok)
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    if len(names) > len(letters):
        raise PatternError(f"einsum {pattern!r}: more than 52 axes")
    short = all(len(n) == 1 for n in names)
    letter = {n: n if short else letters[i] for i, n in enumerate(names)}
    letter[ELL] = "..."

    def spell(op: list[str]) -> str:
        return "".join(letter[t] for t in op)

    return ",".join(spell(op) for op in operands) + "->" + spell(out)


def _star_split(pattern: str, what: str) -> tuple[int, int]:
    """Dims before and after the `*` of a pack/unpack pattern."""
    tokens = pattern.split()
    if tokens.count("*") != 1 or any(not (t == "*" or t.isidentifier()) for t in tokens):
        raise PatternError(f"{what} {pattern!r}: names and exactly one '*' expected")
    before = tokens.index("*")
    return before, len(tokens) - before - 1


def pack_source(fname: str, pattern: str) -> str:
    """`def fname(tensors)` -> (packed, packed_shapes), as einops.pack."""
    before, after = _star_split(pattern, "pack")
    end = f"t.dim() - {after}" if after else "t.dim()"
    return (f"def {fname}(tensors):\n"
            f'    """einops.pack(tensors, {pattern!r})."""\n'
            f"    shapes = [t.shape[{before}:{end}] for t in tensors]\n"
            f"    flat = [t.reshape(*t.shape[:{before}], s.numel(), *t.shape[{end}:])\n"
            f"            for t, s in zip(tensors, shapes)]\n"
            f"    return torch.cat(flat, dim={before}), shapes\n")


def unpack_source(fname: str, pattern: str) -> str:
    """`def fname(x, shapes)` -> list of tensors, as einops.unpack (one shape may hold -1)."""
    before, after = _star_split(pattern, "unpack")
    end = f"x.dim() - {after}" if after else "x.dim()"
    return (f"def {fname}(x, shapes):\n"
            f'    """einops.unpack(x, shapes, {pattern!r})."""\n'
            f"    lengths = [-1 if -1 in s else math.prod(s) for s in shapes]\n"
            f"    if -1 in lengths:\n"
            f"        lengths[lengths.index(-1)] = x.shape[{before}] - sum(lengths) - 1\n"
            f"    parts = x.split(lengths, dim={before})\n"
            f"    return [p.reshape(*x.shape[:{before}], *s, *x.shape[{end}:])\n"
            f"            for p, s in zip(parts, shapes)]\n")


def runtime_pack_source(fname: str) -> str:
    """`def fname(tensors, pattern)`: einops.pack for a pattern known only at run time (a
    `pack_one(t, pattern)` helper); pack patterns are names and one `*`, parsed in two lines."""
    return (f"def {fname}(tensors, pattern):\n"
            f'    """einops.pack(tensors, pattern)."""\n'
            f"    axes = pattern.split()\n"
            f"    before, after = axes.index('*'), len(axes) - axes.index('*') - 1\n"
            f"    shapes = [t.shape[before:t.dim() - after] for t in tensors]\n"
            f"    flat = [t.reshape(*t.shape[:before], s.numel(), *t.shape[t.dim() - after:])\n"
            f"            for t, s in zip(tensors, shapes)]\n"
            f"    return torch.cat(flat, dim=before), shapes\n")


def runtime_unpack_source(fname: str) -> str:
    """`def fname(x, shapes, pattern)`: einops.unpack for a pattern known only at run time."""
    return (f"def {fname}(x, shapes, pattern):\n"
            f'    """einops.unpack(x, shapes, pattern)."""\n'
            f"    axes = pattern.split()\n"
            f"    before, after = axes.index('*'), len(axes) - axes.index('*') - 1\n"
            f"    lengths = [-1 if -1 in s else math.prod(s) for s in shapes]\n"
            f"    if -1 in lengths:\n"
            f"        lengths[lengths.index(-1)] = x.shape[before] - sum(lengths) - 1\n"
            f"    parts = x.split(lengths, dim=before)\n"
            f"    return [p.reshape(*x.shape[:before], *s, *x.shape[x.dim() - after:])\n"
            f"            for p, s in zip(parts, shapes)]\n")


def parse_shape_source(fname: str, pattern: str) -> str:
    """`def fname(x)` -> {axis: length}, as einops.parse_shape (`_` skips a dim)."""
    tokens = pattern.replace("...", f" {ELL} ").split()
    if tokens.count(ELL) > 1 or any(not (t in ("_", ELL) or t.isidentifier()) for t in tokens):
        raise PatternError(f"parse_shape {pattern!r}: names, '_' and one '...' expected")
    targets = ["*_ell" if t == ELL else "_" if t == "_" else _var(t) for t in tokens]
    names = [t for t in tokens if t not in ("_", ELL)]
    lhs = targets[0] + "," if len(targets) == 1 else ", ".join(targets)
    items = ", ".join(f"{n!r}: {_var(n)}" for n in names)
    return (f"def {fname}(x):\n"
            f'    """einops.parse_shape(x, {pattern!r})."""\n'
            f"    {lhs} = x.shape\n"
            f"    return {{{items}}}\n")
