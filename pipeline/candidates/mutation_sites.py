"""Where each mutation kind can edit a kernel: the kernel sources inside a candidate file, C++ text
with comments and literals masked, and one site finder per kind (`FINDERS`).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from verifier import pyast

_CXX_MARKERS = ("#include", "__global__", "torch::Tensor", "at::Tensor", "data_ptr")
_MASK = re.compile(r"//[^\n]*|/\*.*?\*/|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])'", re.S)
_IF = re.compile(r"\bif\s*\(")
_COMPARE = re.compile(r"(?<![<>])(<=|>=|<|>)(?![<>=])")


@dataclass
class Site:
    """One place a mutation can be made: replace code[start:end] (absolute offsets)."""

    start: int
    end: int
    replacement: str
    description: str
    priority: int = 1  # lower first: the sites most certain to change behaviour
    insert_at: int | None = None  # a second edit: insert `insert_text` here (hoisting)
    insert_text: str = ""

# --- locating kernel source -------------------------------------------------------------------


def kernel_spans(code: str) -> list[tuple[int, int]]:
    """Character spans of the string literals in `code` that hold C++/CUDA source."""
    try:
        tree = pyast.parse(code)
    except SyntaxError:
        return []
    lines = code.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    spans = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                and any(m in node.value for m in _CXX_MARKERS) and ";" in node.value
                and node.end_lineno is not None and node.end_col_offset is not None):
            start = offsets[node.lineno - 1] + _char_col(lines[node.lineno - 1], node.col_offset)
            end = offsets[node.end_lineno - 1] + _char_col(lines[node.end_lineno - 1],
                                                           node.end_col_offset)
            spans.append((start, end))
    return sorted(spans)


def _char_col(line: str, byte_col: int) -> int:
    return len(line.encode("utf-8")[:byte_col].decode("utf-8", "replace"))


def masked(text: str) -> str:
    """`text` with comments and C++ string/char literals blanked (same length, same lines)."""
    return _MASK.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def _match_close(view: str, open_idx: int) -> int | None:
    """Index of the bracket closing the one at `open_idx` in `view`, or None."""
    pairs = {"(": ")", "{": "}", "[": "]"}
    opener = view[open_idx]
    closer = pairs[opener]
    depth = 0
    for i in range(open_idx, len(view)):
        if view[i] == opener:
            depth += 1
        elif view[i] == closer:
            depth -= 1
            if depth == 0:
                return i
    return None


def _enclosing_open_brace(view: str, pos: int) -> int | None:
    depth = 0
    for i in range(pos - 1, -1, -1):
        if view[i] == "}":
            depth += 1
        elif view[i] == "{":
            if depth == 0:
                return i
            depth -= 1
    return None


def line_start(text: str, pos: int) -> int:
    return text.rfind("\n", 0, pos) + 1


def line_end(text: str, pos: int) -> int:
    end = text.find("\n", pos)
    return len(text) if end < 0 else end


def _delete_span(view: str, start: int, end: int) -> tuple[int, int]:
    """Widen [start, end) to whole lines when nothing else is on them."""
    ls, le = line_start(view, start), line_end(view, end)
    if not view[ls:start].strip() and not view[end:le].strip():
        return ls, min(le + 1, len(view))
    return start, end


# --- the kinds ----------------------------------------------------------------------------------

_FOR = re.compile(r"\bfor\s*\(\s*(?:[\w:<>]+\s+)*?(\w+)\s*=\s*[^;]+;\s*(\1)\s*<\s*([^;]+?)\s*;")
_GUARD_LT = re.compile(r"\bif\s*\(\s*([\w.]+)\s*<\s*([\w.\->]+)\s*\)")


def _off_by_one(view: str, base: int, backend: str) -> list[Site]:
    sites = []
    for m in _FOR.finditer(view):
        bound = m.group(3)
        if any(tok in bound for tok in ("?", "&&", "||", ",")) or bound.strip() in ("0", "1"):
            continue
        sites.append(Site(base + m.start(3), base + m.end(3), f"{bound} - 1",
                          f"loop over `{m.group(1)}` stops one iteration early "
                          f"(`< {bound} - 1` instead of `< {bound}`)", priority=0))
    for m in _GUARD_LT.finditer(view):
        bound = m.group(2)
        sites.append(Site(base + m.start(2), base + m.end(2), f"{bound} - 1",
                          f"guard `{m.group(1)} < {bound}` off by one (`< {bound} - 1`)"))
    return sites


def _missing_bound_check(view: str, base: int, backend: str) -> list[Site]:
    sites = []
    for m in _IF.finditer(view):
        if re.search(r"\belse\s*$", view[max(0, m.start() - 12):m.start()]):
            continue  # removing one arm of an else-if chain changes structure, not a bound
        close = _match_close(view, m.end() - 1)
        if close is None:
            continue
        cond = view[m.end():close]
        if not _COMPARE.search(cond):
            continue
        rest = close + 1
        while rest < len(view) and view[rest].isspace():
            rest += 1
        padding = "&&" in cond or "||" in cond or re.search(r">=\s*0\b|<\s*0\b", cond)
        what = f"bound check `if ({' '.join(cond.split())})` removed"
        jump = re.match(r"(return|continue|break)\b[^;]*;", view[rest:])
        if jump:
            start, end = _delete_span(view, m.start(), rest + jump.end())
            sites.append(Site(base + start, base + end, "", what, 0 if padding else 1))
            continue
        if view[rest:rest + 1] == "{":
            block_end = _match_close(view, rest)
            if block_end is None:
                continue
            after = view[block_end + 1:block_end + 40].lstrip()
        else:
            semi = view.find(";", rest)
            if semi < 0:
                continue
            after = view[semi + 1:semi + 40].lstrip()
        if after.startswith("else"):
            continue
        sites.append(Site(base + m.start(), base + rest, "", what, 0 if padding else 1))
    return sites


def _missing_syncthreads(view: str, base: int, backend: str) -> list[Site]:
    sites = []
    for m in re.finditer(r"__syncthreads\s*\(\s*\)\s*;", view):
        start, end = _delete_span(view, m.start(), m.end())
        sites.append(Site(base + start, base + end, "",
                          "`__syncthreads()` removed: threads read shared memory before "
                          "others have written it"))
    return sites


_TERM = r"(\([^()\[\]]+\)|[A-Za-z_][\w.]*)"
_SUBSCRIPT = re.compile(rf"\[\s*{_TERM}\s*\*\s*([A-Za-z_][\w.]*)\s*\+\s*([A-Za-z_][\w.]*)\s*\]")
_TWO_STRIDES = re.compile(r"\b([A-Za-z_]\w*)\s*\*\s*([A-Za-z_]\w*)\s*\+\s*([A-Za-z_]\w*)\s*\*\s*"
                          r"([A-Za-z_]\w*)")
_SHUFFLE_LOOP = re.compile(r"\bfor\s*\(\s*(?:unsigned\s+)?int\s+(\w+)\s*=\s*(16|warpSize\s*/\s*2)"
                           r"\s*;\s*\1\s*>\s*0\s*;\s*\1\s*(?:>>=\s*1|/=\s*2)\s*\)")


def _wrong_stride(view: str, base: int, backend: str) -> list[Site]:
    sites = []
    for m in _SUBSCRIPT.finditer(view):
        row, stride, col = m.groups()
        if row == col:
            continue
        sites.append(Site(base + m.start(), base + m.end(), f"[{col} * {stride} + {row}]",
                          f"index `[{col} * {stride} + {row}]` uses the wrong stride: it "
                          f"should be `[{row} * {stride} + {col}]`", priority=0))
    for sub in re.finditer(r"\[([^\[\]]+)\]", view):
        for m in _TWO_STRIDES.finditer(sub.group(1)):
            i, si, k, sk = m.groups()
            if si == sk or i == k:
                continue
            at = base + sub.start(1) + m.start()
            sites.append(Site(at, at + len(m.group(0)), f"{i} * {sk} + {k} * {si}",
                              f"strides swapped: `{i}` steps by `{sk}` and `{k}` by `{si}`",
                              priority=0))
    for m in _SHUFFLE_LOOP.finditer(view):
        sites.append(Site(base + m.start(2), base + m.end(2), "8",
                          "warp reduction starts at offset 8 instead of 16: lanes 16-31 never "
                          "reach lane 0", priority=1))
    return sites


_GLOBAL_INDEX = re.compile(r"blockIdx\.([xyz])\s*\*\s*(\(\s*\w+\s*\)\s*)?blockDim\.\1\s*\+\s*"
                           r"threadIdx\.\1")


def _wrong_index(view: str, base: int, backend: str) -> list[Site]:
    sites = []
    for m in _GLOBAL_INDEX.finditer(view):
        d, cast = m.group(1), m.group(2) or ""
        text = f"threadIdx.{d} * {cast}blockDim.{d} + blockIdx.{d}"
        sites.append(Site(base + m.start(), base + m.end(), text,
                          f"global index swaps block and thread index (`{text}`)"))
    return sites


_FLOAT_DECL = re.compile(r"\b(float|double|scalar_t|acc_t|accscalar_t|half|__half)\s+(\w+)"
                         r"\s*=\s*([^;{}]+);")
_CAST = re.compile(r"static_cast<\s*(float|double)\s*>|\(\s*(float|double)\s*\)(?=\s*[\w(])")


def _wrong_cast(view: str, base: int, backend: str) -> list[Site]:
    sites = []
    for m in _FLOAT_DECL.finditer(view):
        name = m.group(2)
        accumulates = re.search(rf"\b{name}\s*(\+=|-=|\*=)", view[m.end():])
        if not accumulates and "[" not in m.group(3):
            continue
        sites.append(Site(base + m.start(1), base + m.end(1), "int",
                          f"`{name}` declared `int` instead of `{m.group(1)}`: values are "
                          "truncated", priority=0 if accumulates else 1))
    for m in _CAST.finditer(view):
        typ = m.group(1) or m.group(2)
        repl = "static_cast<int>" if m.group(1) else "(int)"
        sites.append(Site(base + m.start(), base + m.end(), repl,
                          f"cast to `int` instead of `{typ}` truncates the value", priority=2))
    return sites


def _for_header_start(view: str, brace: int) -> int | None:
    """Where the `for (...)` whose body opens at `brace` starts, or None for another block."""
    close = brace - 1
    while close >= 0 and view[close].isspace():
        close -= 1
    if close < 0 or view[close] != ")":
        return None
    depth = 0
    for i in range(close, -1, -1):
        if view[i] == ")":
            depth += 1
        elif view[i] == "(":
            depth -= 1
            if depth == 0:
                lo = max(0, i - 40)
                word = re.search(r"\bfor\s*$", view[lo:i])
                return lo + word.start() if word else None
    return None


_NOT_TYPES = {"return", "else", "case", "goto", "delete", "new", "typedef", "using", "do",
              "const", "static", "volatile", "auto"}
_ACC_DECL = re.compile(r"\b((?:const\s+)?[A-Za-z_][\w:]*)\s+(\w+\s*=\s*[^;{},]+"
                       r"(?:,\s*\w+\s*=\s*[^;{},]+)*);")
_CONSTANT = re.compile(r"[-+]?\s*(?:[\d.]+(?:[eE][-+]?\d+)?[fFlLuU]*|[A-Z_][A-Z0-9_]*"
                       r"|std::numeric_limits<[\w\s]+>::\w+\(\)|\(\w+\)\s*\(?[\d.]+f?\)?)")
_RESET = re.compile(r"\b(?:std::)?(?:fill|memset)\s*\([^;]*\)\s*;")


def _is_accumulator(name: str, rest: str) -> bool:
    """`name` is updated later: `+=`-style, `x = f(x, ..)`, or by reference as a first argument."""
    return bool(re.search(rf"\b{name}\s*(\+=|-=|\*=|/=)|\b{name}\s*=\s*[^;]*\b{name}\b"
                          rf"|\b\w+\s*\(\s*{name}\s*,", rest))


def _uninit_accumulator(view: str, base: int, backend: str) -> list[Site]:
    sites = []
    gpu = backend != "cpu"
    for m in _ACC_DECL.finditer(view):
        typ = m.group(1)
        if typ in _NOT_TYPES or typ.startswith("const") or typ.split("::")[-1] in _NOT_TYPES:
            continue
        prev = max(view.rfind(ch, 0, m.start()) for ch in ";{}()")
        if (prev >= 0 and view[prev] in "()") or view[prev + 1:m.start()].strip():
            continue  # part of a larger statement (a for header, a call), not a declaration
        decls = [d.split("=", 1) for d in _split_top(m.group(2))]
        names = [d[0].strip() for d in decls]
        if not all(len(d) == 2 and re.fullmatch(r"[A-Za-z_]\w*", n)
                   for d, n in zip(decls, names, strict=True)):
            continue
        if not any(_is_accumulator(n, view[m.end():]) for n in names):
            continue
        # a running sum needs its zero; a running max/min often does not (softmax is
        # shift-invariant), so a bare declaration drops only the sums' initialisers if any
        rest = view[m.end():]
        summed = [n for n in names if re.search(rf"\b{n}\s*(\+=|-=)", rest)]
        bare = f"{typ} " + ", ".join(
            n if not summed or n in summed else f"{n} ={d[1]}"
            for n, d in zip(names, decls, strict=True)) + ";"
        what = ", ".join(f"`{n}`" for n in names)
        bare_what = ", ".join(f"`{n}`" for n in (summed or names))
        start, end = _delete_span(view, m.start(), m.end())
        brace = _enclosing_open_brace(view, m.start())
        at = _for_header_start(view, brace) if brace is not None else None
        # On a GPU a thread often handles one output, so hoisting may not show; an
        # uninitialised register does. On a CPU each thread loops over many outputs.
        constant = all(_CONSTANT.fullmatch(d[1].strip()) for d in decls)
        if at is not None and constant:  # an initialiser naming loop variables cannot move
            stmt = line_start(view, at)
            pragma_line = line_start(view, max(0, stmt - 1))
            if view[pragma_line:stmt].lstrip().startswith("#pragma"):
                stmt = pragma_line
            indent = re.match(r"[ \t]*", view[stmt:]).group(0)
            sites.append(Site(
                base + start, base + end, "",
                f"accumulator {what} initialised once outside the loop instead of per "
                "iteration: it carries over between outputs", priority=2 if gpu else 0,
                insert_at=base + stmt, insert_text=f"{indent}{view[m.start():m.end()]}\n"))
        sites.append(Site(base + m.start(), base + m.end(), bare,
                          f"accumulator {bare_what} declared without an initial value",
                          priority=(0 if summed else 1) + (0 if gpu else 1)))
    for m in _RESET.finditer(view):
        start, end = _delete_span(view, m.start(), m.end())
        sites.append(Site(base + start, base + end, "",
                          "the accumulator buffer is no longer reset before each output "
                          f"(`{' '.join(m.group(0).split())}` removed)", priority=0))
    return sites


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts


def _launches(view: str) -> Iterable[tuple[int, int, list[tuple[int, int]]]]:
    """(start, end, argument spans) of each `<<<...>>>` launch configuration."""
    for m in re.finditer(r"<<<", view):
        close = view.find(">>>", m.end())
        if close < 0:
            continue
        spans, depth, arg_start = [], 0, m.end()
        for i in range(m.end(), close):
            ch = view[i]
            if ch in "([{":
                depth += 1
            elif ch in ")]}":
                depth -= 1
            elif ch == "," and depth == 0:
                spans.append((arg_start, i))
                arg_start = i + 1
        spans.append((arg_start, close))
        yield m.start(), close + 3, spans


def _bad_launch_config(view: str, base: int, backend: str) -> list[Site]:
    sites = []
    for _start, _end, args in _launches(view):
        if len(args) < 2:
            continue
        a, b = args[1]
        while a < b and view[a].isspace():
            a += 1
        while b > a and view[b - 1].isspace():
            b -= 1
        block = view[a:b]
        if re.fullmatch(r"[A-Za-z_]\w*", block):
            define = re.search(rf"\b(?:int|int64_t|unsigned|size_t|long|auto)\s+{block}\s*=\s*"
                               r"(\d+)\s*;", view)
            if define:
                sites.append(Site(base + define.start(1), base + define.end(1), "2048",
                                  f"`{block}` = 2048 threads per block, above the device "
                                  "limit of 1024: the kernel never launches", priority=0))
                continue
        sites.append(Site(base + a, base + b, "2048",
                          "launched with 2048 threads per block, above the device limit of "
                          "1024: the kernel never launches"))
    return sites


def _omp_race(view: str, base: int, backend: str) -> list[Site]:
    sites = []
    for m in re.finditer(r"#pragma\s+omp[^\n]*?(\s*\breduction\s*\([^)]*\))", view):
        sites.append(Site(base + m.start(1), base + m.end(1), "",
                          "OpenMP `reduction` clause removed: threads race on the shared "
                          "accumulator", priority=0))
    for m in re.finditer(r"#pragma\s+omp\s+(atomic|critical)\b[^\n]*", view):
        start, end = _delete_span(view, m.start(), m.end())
        sites.append(Site(base + start, base + end, "",
                          f"`#pragma omp {m.group(1)}` removed: a data race on the update"))
    return sites


FINDERS: dict[str, Callable[[str, int, str], list[Site]]] = {
    "off_by_one": _off_by_one,
    "missing_bound_check": _missing_bound_check,
    "missing_syncthreads": _missing_syncthreads,
    "wrong_stride": _wrong_stride,
    "wrong_index": _wrong_index,
    "wrong_cast": _wrong_cast,
    "uninit_accumulator": _uninit_accumulator,
    "bad_launch_config": _bad_launch_config,
    "omp_race": _omp_race,
}
