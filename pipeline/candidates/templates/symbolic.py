"""Sizes and constructor values that the candidate reads at run time instead of baking in.

The probe traces with symbolic sizes, so every traced size is a `Dim`: an int (the size at the
traced set, which lowering decisions use) that also carries its expression over input dims
(`s0*s1`). Constructor floats that the probe matched to an attribute become `Scalar`s carrying
`self.scale`. Formatting either into text writes a marker; the builder resolves markers by
context: in `forward` to Python (`x.size(0) * x.size(1)`, `self.scale`), in C++ to a parameter
of the kernel threaded through every function that uses it (`plumb`), in prose to the number.
"""

from __future__ import annotations

import re

_MARK = re.compile(r"⟦([dc]):([^|⟧]*)\|([^⟧]*)⟧")


class Dim(int):
    """A size: its value at the traced size set and its expression over input-dim symbols."""

    expr: str

    def __new__(cls, value: int, expr: str) -> Dim:
        obj = super().__new__(cls, value)
        obj.expr = expr
        return obj

    def __repr__(self) -> str:
        return f"⟦d:{self.expr}|{int(self)}⟧"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return format(int(self), spec) if spec else repr(self)

    def _op(self, other, sym: str, value: int, swap: bool = False):
        if not isinstance(other, int) or isinstance(other, bool):
            return NotImplemented
        a, b = _text(self), _text(other)
        if swap:
            a, b = b, a
        return Dim(value, f"({a}){sym}({b})")

    def __mul__(self, other):
        if isinstance(other, int) and not isinstance(other, Dim) and other == 1:
            return self
        return self._op(other, "*", int(self) * int(other))

    def __rmul__(self, other):
        if isinstance(other, int) and not isinstance(other, Dim) and other == 1:
            return self
        return self._op(other, "*", int(other) * int(self), swap=True)

    def __add__(self, other):
        if isinstance(other, int) and not isinstance(other, Dim) and other == 0:
            return self
        return self._op(other, "+", int(self) + int(other))

    def __radd__(self, other):
        if isinstance(other, int) and not isinstance(other, Dim) and other == 0:
            return self
        return self._op(other, "+", int(other) + int(self), swap=True)

    def __sub__(self, other):
        return self._op(other, "-", int(self) - int(other))

    def __rsub__(self, other):
        return self._op(other, "-", int(other) - int(self), swap=True)

    def __floordiv__(self, other):
        if isinstance(other, int) and not isinstance(other, Dim) and other == 1:
            return self
        if isinstance(other, int) and int(other) and self.expr.endswith(f"*({_text(other)})") \
                and _balanced(self.expr[1:-len(f")*({_text(other)})")]) \
                and self.expr.startswith("("):
            inner = self.expr[1:-len(f")*({_text(other)})")]
            return Dim(int(self) // int(other), inner)  # (a*b)//b -> a
        return self._op(other, "//", int(self) // int(other))

    def __rfloordiv__(self, other):
        return self._op(other, "//", int(other) // int(self), swap=True)

    def __mod__(self, other):
        return self._op(other, "%", int(self) % int(other))

    def __neg__(self):
        return Dim(-int(self), f"-({self.expr})")


class Scalar(float):
    """A float constructor value and the attribute expression that holds it (`self.scale`)."""

    expr: str

    def __new__(cls, value: float, expr: str) -> Scalar:
        obj = super().__new__(cls, value)
        obj.expr = expr
        return obj


def _text(v: int) -> str:
    return v.expr if isinstance(v, Dim) else str(int(v))


def scalar_marker(value: Scalar, ctype: str) -> str:
    """Marker for a constructor scalar used in C++ as `ctype`."""
    return f"⟦c:{value.expr}:{ctype}|{float(value)!r}⟧"


def decode(value, symbols: set[str]):
    """Probe encoding -> Dim where a value is symbolic (recursively through lists/dicts)."""
    if isinstance(value, dict):
        if set(value) == {"scalar", "value"}:  # a float computed from sizes (specialized.py)
            if not set(re.findall(r"[sk]\d+", value["scalar"])) <= symbols:
                return float(value["value"])
            return Scalar(float(value["value"]), value["scalar"])
        if set(value) == {"sym", "value"}:
            expr = to_python(value["sym"])
            if expr is None or not set(re.findall(r"[sk]\d+", expr)) <= symbols:
                return int(value["value"])  # an expression we cannot write: keep the number
            return Dim(int(value["value"]), expr)
        return {k: decode(v, symbols) for k, v in value.items()}
    if isinstance(value, list):
        return [decode(v, symbols) for v in value]
    return value


def to_python(expr: str) -> str | None:
    """A sympy size expression as Python text, or None when it uses a function we do not map."""
    text = expr.replace("Max(", "max(").replace("Min(", "min(")
    if re.fullmatch(r"[\w()+\-*/, %]*", text) is None:
        return None
    words = set(re.findall(r"[A-Za-z_]\w*", text))
    if not words <= ({"max", "min"} | set(re.findall(r"[sk]\d+", text))):
        return None
    return text


def markers(text: str) -> list[str]:
    """Distinct markers in order of first appearance."""
    return list(dict.fromkeys(m.group(0) for m in _MARK.finditer(text)))


def as_python(text: str, names: dict[str, str]) -> str:
    """Resolve markers for forward: symbols become `x.size(0)`, scalars their attribute."""
    def sub(m: re.Match) -> str:
        if m.group(1) == "c":
            return _tidy(re.sub(r"\b[sk]\d+\b", lambda s: names[s.group(0)],
                                m.group(2).split(":")[0]))
        expr = re.sub(r"\b[sk]\d+\b", lambda s: names[s.group(0)], m.group(2))
        return _tidy(expr)

    return _MARK.sub(sub, text)


def _tidy(expr: str) -> str:
    """Drop the parentheses that wrap a bare name or call: `(x.size(0))*(4)` -> `x.size(0)*4`."""
    prev = None
    while prev != expr:
        prev = expr
        expr = re.sub(r"(?<![\w.])\((\w+(?:\.\w+)*(?:\(\d+\))?|-?\d+)\)(?!\s*\()", r"\1", expr)
        expr = re.sub(r"^\((.*)\)$", lambda m: m.group(1) if _balanced(m.group(1)) else m.group(0),
                      expr)
    return expr


def _balanced(text: str) -> bool:
    depth = 0
    for ch in text:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth < 0:
            return False
    return depth == 0


def as_numbers(text: str) -> str:
    """Resolve markers for prose: the value at the traced sizes."""
    return _MARK.sub(lambda m: m.group(3), text)


def marker_value(marker: str) -> str:
    return _MARK.fullmatch(marker).group(3)


def param_names(marks: list[str], source: str) -> list[tuple[str, str, str]]:
    """(marker, C++ parameter name, C++ type) for each marker, names unused in `source`."""
    out, used = [], set(re.findall(r"\b\w+\b", _MARK.sub(" ", source)))
    for k, mk in enumerate(marks):
        m = _MARK.fullmatch(mk)
        if m.group(1) == "c":
            attr, ctype = m.group(2).split(":")
            words = re.findall(r"[A-Za-z_]\w*", attr)
            base = words[-1] if attr.startswith("self") and words[-1] != "self" else "scale"
            typ = ctype
        else:
            base, typ = f"size{k}", "int64_t"
        name, i = base, 1
        while name in used:
            name, i = f"{base}{i}", i + 1
        used.add(name)
        out.append((mk, name, typ))
    return out


def top_level_functions(src: str) -> list[tuple[str, int, int, int]]:
    """(name, start of `(`+1 of the parameter list, index of its `)`, end of body) per function."""
    out = []
    depth, i = 0, 0
    while i < len(src):
        ch = src[i]
        if ch == "{":
            if depth == 0:
                head_end = i
                j = src.rfind(")", 0, head_end)
                between = src[j + 1:head_end].strip() if j >= 0 else "x"
                if j >= 0 and between in ("", "const"):
                    k = _open_paren(src, j)
                    m = re.search(r"(\w+)\s*$", src[:k])
                    if m and m.group(1) not in ("if", "for", "while", "switch"):
                        end = _close_brace(src, i)
                        out.append((m.group(1), k + 1, j, end))
                        i = end
                        continue
            depth += 1
        elif ch == "}":
            depth -= 1
        i += 1
    return out


def _open_paren(src: str, close: int) -> int:
    depth = 0
    for k in range(close, -1, -1):
        depth += {")": 1, "(": -1}.get(src[k], 0)
        if depth == 0:
            return k
    raise ValueError("unbalanced parentheses in kernel source")


def _close_paren(src: str, open_: int) -> int:
    depth = 0
    for k in range(open_, len(src)):
        depth += {"(": 1, ")": -1}.get(src[k], 0)
        if depth == 0:
            return k
    raise ValueError("unbalanced parentheses in kernel source")


def _close_brace(src: str, open_: int) -> int:
    depth = 0
    for k in range(open_, len(src)):
        depth += {"{": 1, "}": -1}.get(src[k], 0)
        if depth == 0:
            return k + 1
    raise ValueError("unbalanced braces in kernel source")


def plumb(source: str, decl: str, host: str) -> tuple[str, str, list[str]]:
    """Turn the markers of one kernel's C++ into parameters threaded from the host function.

    Every function whose body uses a marker (or calls one that does) gains the parameters, and
    every call of it (plain or `<<<...>>>` launch) passes them on; the host function `host`
    receives them from forward. Returns (source, decl, markers in parameter order).
    """
    marks = markers(source)
    if not marks:
        return source, decl, []
    params = param_names(marks, source)
    for mk, name, _ in params:
        source = source.replace(mk, name)
    names = [n for _, n, _ in params]
    types = {n: t for _, n, t in params}
    funcs = top_level_functions(source)
    needs: dict[str, list[str]] = {}
    for fname, _, close, end in funcs:
        needs[fname] = [n for n in names if re.search(rf"\b{n}\b", source[close:end])]
    calls = {f: [g for g in needs if g != f and re.search(rf"\b{g}\s*(?:<<<.*?>>>)?\s*\(",
                                                           source[s:e], re.S)]
             for f, s, _, e in funcs}
    changed = True
    while changed:
        changed = False
        for f, callees in calls.items():
            for g in callees:
                extra = [n for n in needs[g] if n not in needs[f]]
                if extra:
                    needs[f] = [n for n in names if n in needs[f] or n in extra]
                    changed = True
    if host in needs:
        needs[host] = names  # the host takes every value forward passes
    # Edit from the end so earlier offsets stay valid: parameter lists first, then call sites.
    edits: list[tuple[int, str]] = []
    for f, _, close, _ in funcs:
        if needs.get(f):
            typ = (lambda n: "double" if types[n] in ("float", "double") else types[n]) \
                if f == host else (lambda n: types[n])
            extra = ", ".join(f"{typ(n)} {n}" for n in needs[f])
            edits.append((close, ", " + extra))
    heads = {s - 1 for _, s, _, _ in funcs}
    for g, args in needs.items():
        if not args:
            continue
        for m in re.finditer(rf"\b{g}\s*(<<<.*?>>>)?\s*\(", source, re.S):
            open_ = m.end() - 1
            if open_ in heads:
                continue
            close = _close_paren(source, open_)
            inner = source[open_ + 1:close].strip()
            edits.append((close, (", " if inner else "") + ", ".join(args)))
    for pos, text in sorted(edits, key=lambda e: e[0], reverse=True):
        source = source[:pos] + text + source[pos:]
    host_extra = ", ".join(
        f"{'double' if types[n] in ('float', 'double') else types[n]} {n}" for n in names)
    decl = decl[:decl.rindex(")")] + ", " + host_extra + ")"
    return source, decl, [mk for mk, _, _ in params]
