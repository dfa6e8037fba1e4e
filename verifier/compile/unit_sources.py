"""The text of a build unit: each spec's sources wrapped in its namespace (includes hoisted,
#line named, its macros undone after it), the bindings, and the log mapped back to a candidate's
lines; what the preprocessor sees of a spec's sources and what they may not do (split out of
verifier/compile/builder.py)."""

from __future__ import annotations

import re

from verifier.checks.extspec import ExtensionSpec, source_line
from verifier.checks.preprocess import SourceScan, hoistable_lines, scan

CAND_FILE = "candidate.py"


def includes_of(sources: list[str]) -> tuple[str, ...]:
    return tuple(sorted({h for src in sources for h in scan(src).includes}))


def spec_scans(spec: ExtensionSpec) -> list[SourceScan]:
    return [scan(s) for s in [*spec.cpp_sources, *spec.cuda_sources]]


def refusal(spec: ExtensionSpec) -> str:
    """Why the spec must not be built at all (it reads files the build must not see), or ""."""
    reasons = [r for sc in spec_scans(spec) for r in sc.reject]
    return "; ".join(dict.fromkeys(reasons))


_LOGGED = re.compile(r"\b(cpp|cuda)_sources\[(\d+)\](?:([:(])(\d+))?")


def _line_directive(spec: ExtensionSpec, kind: str, i: int) -> str:
    """Errors in source `i` of `kind` (cpp, cuda) are reported at its own lines, under a name
    that holds the spec key (so a batch's log blames the spec) and that `_spec_log` shows."""
    return f'#line 1 "{spec.key}/{kind}{i}"'


def candidate_log(log: str, spec: ExtensionSpec, code: str) -> str:
    """A spec's build log with its sources and their lines (`cpp_sources[0]:12`, nvcc's
    `cuda_sources[0](12)`) as lines of `code`, the candidate that called load_inline with them
    (left as they are where a source is not in `code` verbatim)."""
    starts: dict[tuple[str, int], int] = {}

    def sub(m: re.Match) -> str:
        kind, i = m.group(1), int(m.group(2))
        sources = spec.cpp_sources if kind == "cpp" else spec.cuda_sources
        if (kind, i) not in starts:
            starts[kind, i] = source_line(code, sources[i]) if i < len(sources) else 0
        first = starts[kind, i]
        if not first:
            return m.group(0)
        return f"{CAND_FILE}{m.group(3)}{first + int(m.group(4)) - 1}" if m.group(4) else CAND_FILE

    return _LOGGED.sub(sub, log) if code else log


def _wrap(spec: ExtensionSpec, sources: list[str], kind: str, includes: list[str]) -> str:
    """The spec's sources in its namespace, includes hoisted into `includes`, #line named, and
    every macro the preprocessor saw it define or undefine undefined after it (a unit holds
    only specs whose scan allows that: `batch_blockers`)."""
    parts = [f"namespace ks_{spec.key} {{"]
    macros: list[str] = []
    for i, src in enumerate(sources):
        parts.append(_line_directive(spec, kind, i))
        sc = scan(src)
        macros += sc.macros
        hoist = hoistable_lines(src, sc)
        out = []
        for n, ln in enumerate(src.split("\n")):
            if n in hoist:
                if hoist[n] and hoist[n] not in includes:
                    includes.append(hoist[n])
                out.append("")
                continue
            out.append(ln)
        parts.append("\n".join(out))
    parts.append(f"}}  // namespace ks_{spec.key}")
    parts += [f"#undef {d}" for d in dict.fromkeys(macros)]
    return "\n".join(parts)


def _bind(spec: ExtensionSpec, i: int, fn: str) -> str:
    """One m.def line, as load_inline writes it (docstring raw, error handling optional)."""
    doc = spec.docstrings[i] if spec.docstrings else fn
    target = f"ks_{spec.key}::{fn}"
    if spec.error_handling:
        target = f"torch::wrap_pybind_function({target})"
    return f'  m.def("k{spec.key}__{fn}", {target}, "{doc}");'


def batch_sources(specs: list[ExtensionSpec], module: str, device_prelude: str
                  ) -> tuple[str, str]:
    """(host unit, device unit or "") for batchable `specs` bound into module `module`."""
    includes: list[str] = []
    bodies = [_wrap(s, s.cpp_sources, "cpp", includes) for s in specs]
    binds = [_bind(s, i, fn) for s in specs for i, fn in enumerate(s.functions or [])]
    host = "\n".join([
        "#include <torch/extension.h>", *(f"#include {i}" for i in includes), *bodies,
        "#line 1 \"ks_bindings.cpp\"", f"PYBIND11_MODULE({module}, m) {{", *binds, "}", ""])
    device = ""
    if any(s.cuda_sources for s in specs):
        dincludes: list[str] = []
        dbodies = [_wrap(s, s.cuda_sources, "cuda", dincludes) for s in specs if s.cuda_sources]
        # torch prepends the device headers unless no_implicit_headers (one flag per batch)
        prelude = [] if all(s.no_implicit_headers for s in specs) else [device_prelude]
        device = "\n".join([*prelude, *(f"#include {i}" for i in dincludes), *dbodies, ""])
    return host, device


def _named(spec: ExtensionSpec, sources: list[str], kind: str) -> list[str]:
    """Each source behind a #line directive naming it (see `_line_directive`)."""
    return [part for i, src in enumerate(sources)
            for part in (_line_directive(spec, kind, i), src)]


def module_sources(spec: ExtensionSpec, device_prelude: str = "") -> tuple[str, str]:
    """Sources of a spec that defines its own PYBIND11_MODULE (built alone), as torch's
    load_inline writes main.cpp and cuda.cu: `torch/extension.h` before the C++ sources,
    the backend's device headers (torch/types.h, cuda.h, cuda_runtime.h) before the device
    sources, neither when `no_implicit_headers`; errors name the spec's source lines."""
    implicit = not spec.no_implicit_headers
    head = ["#include <torch/extension.h>"] if implicit else []
    host = "\n".join([*head, *_named(spec, spec.cpp_sources, "cpp"), ""])
    if not spec.cuda_sources:
        return host, ""
    dhead = [device_prelude] if implicit and device_prelude else []
    return host, "\n".join([*dhead, *_named(spec, spec.cuda_sources, "cuda"), ""])
