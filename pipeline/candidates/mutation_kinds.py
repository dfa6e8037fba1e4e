"""More bug kinds, the ones real kernels get wrong beyond one-line bounds and casts.

    grid_rounding        a ceil-divided grid or chunk count rounded down (`(n + T - 1) / T` ->
                         `n / T`): the tail of the data is never processed
    unstable_softmax     the running max no longer subtracted before `exp` (`expf(v - m)` ->
                         `expf(v)`): overflows to inf/nan for large logits
    wrong_reduction_axis an accumulation reads `[i * S + j]` as `[j * S + i]`, or a loop over the
                         reduced axis reads `base[r * inner]` as `base[r]`: it reduces along
                         another axis of the tensor
    broadcast_stride     a broadcast operand indexed by the wrong dimension (`b[i % C]` ->
                         `b[i / C]`, `b[i / C]` -> `b[i % C]`; with per-dimension indices
                         split off a flat one, `b[i1 * 1]` -> `b[i2 * 1]`)
    int32_index          a 64-bit flat index narrowed to `int` (overflows past 2^31 elements;
                         the verifier sees it only at such sizes, so GPU kernels only)
    wrong_init           a running max/min started at 0 instead of -inf/+inf (`v = -INFINITY` ->
                         `v = 0`): a window or row of only negative (positive) values gives 0
                         (not a softmax's max: its shift cancels out, so 0 is no bug)

Each finder takes the masked kernel text (`mutation_sites.masked`) and its absolute offset, like
the finders in `mutation_sites`.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from pipeline.candidates.mutation_sites import Site, line_end, line_start

_CEIL_DIV = re.compile(r"\(\s*([\w.()]+(?:\s*[*]\s*[\w.()]+)?)\s*\+\s*([\w.]+)\s*-\s*1\s*\)"
                       r"\s*/\s*\2\b")


def _grid_rounding(view: str, base: int, backend: str) -> list[Site]:
    sites = []
    for m in _CEIL_DIV.finditer(view):
        n, t = m.group(1), m.group(2)
        in_launch = "<<<" in view[m.end():line_end(view, m.end())] or re.search(
            r"\b(blocks?|grid\w*|chunks?|n_?tiles?|num_\w+)\b", view[line_start(view, m.start()):
                                                                   m.start()])
        sites.append(Site(base + m.start(), base + m.end(), f"{n} / {t}",
                          f"`({n} + {t} - 1) / {t}` rounded down to `{n} / {t}`: the last "
                          f"partial block of `{n}` is never processed",
                          priority=0 if in_launch else 1))
    return sites


_EXP_SUB = re.compile(r"\b(expf|__expf|exp|std::exp)\s*\(\s*((?:[^()\-]|\([^()]*\))+?)\s*-\s*"
                      r"([A-Za-z_][\w.]*(?:\[[^\]]*\])?)\s*\)")


def _unstable_softmax(view: str, base: int, backend: str) -> list[Site]:
    sites = []
    for m in _EXP_SUB.finditer(view):
        fn, value, shift = m.groups()
        if not re.search(r"max|mx|\bm\b|^m\w*$", shift, re.I):
            continue
        sites.append(Site(base + m.start(), base + m.end(), f"{fn}({value})",
                          f"the max `{shift}` is no longer subtracted before `{fn}`: large "
                          "logits overflow to inf and the softmax returns nan", priority=0))
    return sites


_SUBSCRIPT = re.compile(r"\[\s*([A-Za-z_]\w*)\s*\*\s*([A-Za-z_][\w.]*)\s*\+\s*([A-Za-z_]\w*)"
                        r"\s*\]")
_ACCUM = re.compile(r"([A-Za-z_][\w.\[\]]*)\s*(\+=|\*=|=\s*(?:fmaxf|fminf|max|min|std::max|"
                    r"std::min)\s*\()")


def _wrong_reduction_axis(view: str, base: int, backend: str) -> list[Site]:
    sites = []
    for acc in _ACCUM.finditer(view):
        stop = view.find(";", acc.end())
        if stop < 0:
            continue
        for m in _SUBSCRIPT.finditer(view, acc.end(), stop):
            outer, stride, inner = m.groups()
            if outer == inner:
                continue
            # a sum or product first: a max/min shift (softmax) can cancel out
            sites.append(Site(base + m.start(), base + m.end(), f"[{inner} * {stride} + {outer}]",
                              f"the accumulation reads `[{inner} * {stride} + {outer}]`: it "
                              f"reduces along the other axis instead of over `{inner}`",
                              priority=0 if acc.group(2) in ("+=", "*=") else 1))
    loops = set(_LOOP_VAR.findall(view))
    for m in _STRIDED_READ.finditer(view):
        arr, var, stride = m.groups()
        after = view[m.end():m.end() + 3].lstrip()
        if var not in loops or stride in loops or (after.startswith("=")
                                                   and not after.startswith("==")):
            continue
        # in a dot product `a[k * sa] * b[k * sb]` the right operand is the one read down its
        # column (a row-major B); the left one's stride is often 1, which no edit can show
        stop = view.find(";", m.end())
        later = _STRIDED_READ.search(view, m.end(), stop if stop >= 0 else len(view))
        sites.append(Site(base + m.start(2), base + m.end(3), var,
                          f"`{arr}[{var} * {stride}]` read as `{arr}[{var}]`: the loop walks "
                          f"the contiguous axis instead of the reduced one (stride `{stride}`)",
                          priority=2 if later else 1))
    return sites


_LOOP_VAR = re.compile(r"\bfor\s*\(\s*(?:int64_t|int|long|size_t)\s+(\w+)\s*=")
_STRIDED_READ = re.compile(r"\b(\w+)\s*\[\s*([A-Za-z_]\w*)\s*\*\s*([A-Za-z_][\w.]*)\s*\]")


_BCAST = re.compile(r"(\w+)\s*\[\s*\(?\s*([A-Za-z_]\w*)\s*(%|/)\s*([A-Za-z_][\w.]*)\s*\)?\s*\]")


def _broadcast_stride(view: str, base: int, backend: str) -> list[Site]:
    sites = []
    for m in _BCAST.finditer(view):
        arr, idx, op, dim = m.groups()
        other = "/" if op == "%" else "%"
        start, end = m.start(2), m.end(4)
        sites.append(Site(base + start, base + end, f"{idx} {other} {dim}",
                          f"broadcast operand `{arr}` indexed by `{idx} {other} {dim}` instead "
                          f"of `{idx} {op} {dim}`: it is broadcast along the wrong dimension",
                          priority=0))
    return sites + _broadcast_index(view, base)


_REM = re.compile(r"\bint64_t\s+rem\s*=\s*\w+\s*;")
_DIM_INDEX = re.compile(r"\bconst\s+int64_t\s+(\w+)\s*=\s*rem\s*%")


def _broadcast_index(view: str, base: int) -> list[Site]:
    """An output index split into per-dimension indices (`i2 = rem % size1`): an operand whose
    subscript uses only some of them is broadcast over the others; give it a wrong one."""
    sites = []
    for rem in _REM.finditer(view):
        stop = view.find("}", rem.end())
        body = view[rem.end():stop if stop >= 0 else len(view)]
        dims = _DIM_INDEX.findall(body)  # innermost first
        if len(dims) < 2:
            continue
        for m in re.finditer(r"\b(\w+)\s*\[([^\[\]]+)\]", body):
            arr, sub = m.groups()
            used = [d for d in dims if re.search(rf"\b{d}\b", sub)]
            if not used or len(used) == len(dims):
                continue
            # its innermost index moves to the nearest dimension it is broadcast over
            u = used[0]
            at = dims.index(u)
            near = sorted((d for d in dims if d not in used),
                          key=lambda d: (abs(dims.index(d) - at), dims.index(d)))
            hit = re.search(rf"\b{u}\b", sub)
            start = base + rem.end() + m.start(2) + hit.start()
            sites.append(Site(start, start + len(u), near[0],
                              f"broadcast operand `{arr}` indexed by `{near[0]}` instead of "
                              f"`{u}`: it is broadcast along the wrong dimension", priority=0))
    return sites


_WIDE_INDEX = re.compile(r"\b(int64_t|long long|size_t|std::size_t|ptrdiff_t)\s+(\w+)\s*=\s*"
                         r"([^;]*(?:blockIdx|\*)[^;]*);")


def _int32_index(view: str, base: int, backend: str) -> list[Site]:
    sites = []
    for m in _WIDE_INDEX.finditer(view):
        name = m.group(2)
        in_for = re.search(r"\bfor\s*\(\s*$", view[line_start(view, m.start()):m.start()])
        sites.append(Site(base + m.start(1), base + m.end(1), "int",
                          f"index `{name}` narrowed from `{m.group(1)}` to `int`: it overflows "
                          "once the tensor has more than 2^31 elements",
                          priority=2 if in_for else 1))
    return sites


_EXTREME_INIT = re.compile(r"\b([A-Za-z_]\w*)\s*=\s*(-?\s*(?:INFINITY|HUGE_VALF?|FLT_MAX|DBL_MAX|"
                           r"std::numeric_limits<[\w\s]+>::(?:infinity|max|lowest)\(\)))\s*[;,]")


def _wrong_init(view: str, base: int, backend: str) -> list[Site]:
    sites = []
    for m in _EXTREME_INIT.finditer(view):
        name, value = m.group(1), m.group(2)
        rest = view[m.end():]
        # a running extreme: compared against, or handed to a combine/max/min call
        if not re.search(rf"[<>]=?\s*{name}\b|\b{name}\s*[<>]|\w\s*\(\s*{name}\s*,", rest):
            continue
        low = value.lstrip().startswith("-") or "lowest" in value
        what, shows = ("max", "only negative") if low else ("min", "only positive")
        # a softmax's shift cancels out: started at 0 it gives the same result (no bug)
        if re.search(rf"\bexp\w*\s*\([^;]*-\s*{name}\b|\b{name}\s*\+\s*log\w*\s*\(", rest):
            continue
        sites.append(Site(base + m.start(2), base + m.end(2), "0",
                          f"the running {what} `{name}` starts at 0 instead of `{value}`: a "
                          f"window of {shows} values gives 0", priority=0))
    return sites


EXTRA_FINDERS: dict[str, Callable[[str, int, str], list[Site]]] = {
    "grid_rounding": _grid_rounding,
    "unstable_softmax": _unstable_softmax,
    "wrong_reduction_axis": _wrong_reduction_axis,
    "broadcast_stride": _broadcast_stride,
    "int32_index": _int32_index,
    "wrong_init": _wrong_init,
}
# kinds whose bug no CPU run can show: the CPU copies of tasks are scaled far below 2^31 elements
GPU_ONLY_EXTRA = ("int32_index",)
