"""Whether a candidate's code stays inside its namespace in a batch unit.

A batch unit (`verifier.compile.builder`) wraps each candidate's sources in `namespace ks_<key> { ... }`.
Inside it, what a candidate declares is `ks_<key>::`'s: another candidate's unqualified calls,
overloads and template specializations never find it, and its symbols cannot interpose on
anyone's. A candidate leaves that namespace by closing it (`}`, the digraph `%>`, a brace a
macro or a skipped `#if` branch hides) and then declares what it likes at global scope (an
overload of `fmaxf` that a neighbour's `fmaxf(v, 0)` picks, `operator new`), or by giving a
name C linkage (`extern "C"` and the header macros that expand to it: a `memcpy` of its own
binds the neighbour's calls in the same object), or by a versioned symbol (`symver`).
`escapes(code)` lists those forms in a source's text after phase 3 with its literals blanked
(`SourceScan.code`); a candidate with any is built as a unit of its own. The code a unit's
objects run at load is checked on the objects (`verifier.compile.load_code`).
"""

from __future__ import annotations

import re

# `extern` declares a name with another linkage unless it is CUDA's dynamic shared memory or an
# explicit instantiation declaration; the literal of `extern "C"` is blanked in the scan's code.
_EXTERN = re.compile(r"\bextern\b(?!\s*(?:__shared__|template)\b)")
_C_LINKAGE_MACROS = re.compile(r"\b(PyMODINIT_FUNC|DLPACK_EXTERN_C|__BEGIN_DECLS|PYBIND11_MODULE|"
                               r"PYBIND11_PLUGIN_IMPL|PYBIND11_PLUGIN|PYBIND11_EXPORT)\b")
_SYMVER = re.compile(r"\b_*symver_*\b")
_DIRECTIVE = re.compile(r"^[ \t\f\v]*(?:#|%:)[ \t\f\v]*(\w*)")
_BRACE = re.compile(r"<%|%>|[{}]")


def escapes(code: str) -> list[str]:
    """Why a source's code (`SourceScan.code`) may reach past its namespace ([] if it cannot)."""
    out = []
    if _EXTERN.search(code):
        out.append("`extern` other than `extern __shared__` can give a name C linkage")
    m = _C_LINKAGE_MACROS.search(code)
    if m:
        out.append(f"{m.group(1)} declares a name with C linkage")
    if _SYMVER.search(code):
        out.append("a symver attribute names a symbol outside its namespace")
    why = _brace_escape(code)
    if why:
        out.append(why)
    return out


def _brace_escape(code: str) -> str:
    """Why the braces of `code` may close the enclosing namespace ("" if they cannot): outside
    directives the depth never falls below 0 and ends at 0, each branch of a conditional leaves
    it where the branch began, and a macro's body is balanced on its own."""
    depth, branches = 0, []  # branches: the depth each open conditional's branches start at
    for n, line in enumerate(code.split("\n"), 1):
        d = _DIRECTIVE.match(line)
        if d:
            name = d.group(1)
            if name in ("if", "ifdef", "ifndef"):
                branches.append(depth)
            elif name in ("elif", "elifdef", "elifndef", "else", "endif") and branches:
                if depth != branches[-1]:
                    return f"line {n}: a conditional branch leaves its braces unbalanced"
                if name == "endif":
                    branches.pop()
            elif name == "define":
                inner = 0
                for b in _BRACE.findall(line):
                    inner += 1 if b in ("{", "<%") else -1
                    if inner < 0:
                        return f"line {n}: a macro closes a brace it did not open"
                if inner:
                    return f"line {n}: a macro's braces are unbalanced"
            continue
        for b in _BRACE.findall(line):
            depth += 1 if b in ("{", "<%") else -1
            if depth < 0:
                return f"line {n}: a `}}` closes the namespace the candidate is wrapped in"
    if depth:
        return "its braces are unbalanced"
    return ""
