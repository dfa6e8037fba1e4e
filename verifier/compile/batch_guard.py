"""Which specs may share a translation unit: a unit holds a spec only when every directive it has
is one the unit neutralises (`verifier.checks.preprocess`: its macros undone after it, its includes
hoisted, its conditionals balanced), when its code stays in its namespace
(`verifier.compile.containment`) and when it defines or undefines no macro that exists before
its code (a header's, a predefined or a reserved one: an #undef would not restore it). The
macros before a spec's code come from the compiler itself (`-dM`), kept on disk per flags and
headers under the toolchain root (split out of verifier/compile/builder.py)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import threading
from pathlib import Path

from verifier.backends import Backend
from verifier.checks.extspec import ExtensionSpec
from verifier.checks.preprocess import macro_baseline, scan
from verifier.compile.containment import escapes
from verifier.compile.unit_sources import includes_of, spec_scans

_LOCK = threading.Lock()
_LOCKS: dict[str, threading.Lock] = {}


def _hash(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def batch_blockers(specs: list[ExtensionSpec], backend: Backend, root: Path, timeout_s: float
                   ) -> dict[str, str]:
    """Spec key -> why it cannot share a unit: a directive the unit cannot neutralise
    (`verifier.checks.preprocess`), or a macro it defines or undefines that exists before its
    code (a header's or a predefined one: an #undef after it would not restore it)."""
    out: dict[str, str] = {}
    for s in specs:
        reasons = [r for sc in spec_scans(s) for r in [*sc.alone, *escapes(sc.code)]]
        for kind, sources in (("host", s.cpp_sources), ("device", s.cuda_sources)):
            names = {m for src in sources for m in scan(src).macros}
            reserved = sorted(n for n in names if n.startswith(("__", "_")) and (
                n.startswith("__") or n[1:2].isupper()))
            if reserved:  # the compilers' own (nvcc's __CUDACC__ is in no -dM of g++)
                reasons.append(f"defines or undefines the reserved {', '.join(reserved[:5])}")
            if not names or reasons:
                continue
            try:
                known = macros_before(kind, s, backend, root, timeout_s)
            except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                reasons.append(f"the headers' macros are unknown ({exc})")
                continue
            clash = sorted(names & known)
            if clash:
                reasons.append(f"redefines or undefines {', '.join(clash[:5])}, defined "
                               "before its code")
        if reasons:
            out[s.key] = "; ".join(reasons)
    return out


def macros_before(kind: str, spec: ExtensionSpec, backend: Backend, root: Path,
                  timeout_s: float) -> frozenset[str]:
    """Macros defined before a spec's code in a unit of `kind` (its flags and headers):
    the compiler's `-dM`, kept on disk under the toolchain root."""
    be = backend
    if kind == "host":
        flags = [*be.host_flags(), *spec.extra_cflags,
                 *(f"-I{p}" for p in spec.extra_include_paths)]
        head = ["#include <torch/extension.h>",
                *(f"#include {i}" for i in includes_of(spec.cpp_sources))]
    else:  # the device unit's headers, read by the host compiler (nvcc's -D/-U kept)
        flags = [*be.host_flags(), *(f for f in spec.extra_cuda_cflags
                                     if f.startswith(("-D", "-U")))]
        head = [*([] if spec.no_implicit_headers else [be.device_prelude]),
                *(f"#include {i}" for i in includes_of(spec.cuda_sources))]
    prefix = "\n".join(head) + "\n"
    path = root / "macros" / f"{_hash(kind, *flags, prefix)}.txt"
    with _LOCK:
        lock = _LOCKS.setdefault(str(path), threading.Lock())
    with lock:
        if path.is_file():
            return frozenset(path.read_text().split())
        names = macro_baseline([be.host_compiler(), "-x", "c++", *flags], prefix, timeout_s)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}-{threading.get_ident()}")
        tmp.write_text("\n".join(sorted(names)))
        os.replace(tmp, path)
        return names
