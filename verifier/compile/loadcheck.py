"""Load-check worker (child side, inside the sandbox): import one built extension, report.

Undefined symbols and crashing static initializers of a batch build surface here, before any
candidate of the batch runs; `verifier.compile.builder` bisects the batch when the import fails.
Reads `loadcheck.json` ({"module": PyInit name, "path": file}) from its working directory.

A batch's shared object is loaded by every candidate of the batch, so its static initializers
run in all of their processes: an import that allocates a lot, takes long, starts threads or
prints fails here too, and the bisection leaves the candidate that does it alone with the
failure (issue 22: one candidate must never change another's verdict).
"""

from __future__ import annotations

import json
import os
import re
import resource
import struct
import sys
import threading
import time
from pathlib import Path

from verifier.isolation.started import reach_candidate

MAX_IMPORT_MB = 256  # peak resident memory an import may add
MAX_IMPORT_S = 10.0
# Compute entry points of the host libraries libtorch carries or links (MKL and its Fortran
# BLAS/LAPACK names, oneDNN, OpenBLAS, fbgemm, XNNPACK, Sleef): called from a candidate's C++
# by name (`extern "C" void sgemm_(...)`), they compute with no aten op, which the worker's
# dispatcher trace of forward cannot see and no at::/torch:: rule reads; a call shorter than
# the ip sampler's MIN_CALL_S is sampled by nobody. What the object imports is what it calls.
HOST_LIBRARY = re.compile(
    r"^(?:cblas_|lapacke_|lapack_|mkl_|dnnl_|mkldnn_|openblas_|goto|xnn_|sleef_|fbgemm)\w*$|"
    r"^[sdcz](?:gemm|gemv|ger[cu]?|axpy|dot[cu]?|scal|copy|swap|nrm2|asum|amax|rot|symm|symv|"
    r"syrk|syr2k|hemm|herk|her2k|trmm|trsm|trmv|trsv|gbmv|sbmv|spmv|getrf|getrs|getri|potrf|"
    r"potrs|gesv|gesdd|gesvd|syevd?|heevd?|geqrf|orgqr|gels|posv)(?:_\w*)?$|"
    r"^_ZN(?:6fbgemm|4dnnl|6mkldnn|7xnnpack|5ideep)", re.IGNORECASE)


def library_imports(path: str) -> list[str]:
    """The undefined dynamic symbols of the shared object `path` that name a host library's
    compute (HOST_LIBRARY); [] for an object that is not ELF64 little-endian."""
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return []
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
                for i in range(shnum)]
    found: list[str] = []
    for _, kind, _, _, off, size, link, _, _, entsize in sections:
        if kind != 11 or not entsize:  # SHT_DYNSYM
            continue
        str_off = sections[link][4]
        for at in range(off, off + size, entsize):
            name_at, _, _, shndx = struct.unpack_from("<IBBH", data, at)
            end = data.index(b"\0", str_off + name_at)
            name = data[str_off + name_at:end].decode(errors="replace")
            if shndx == 0 and name and HOST_LIBRARY.match(name.split("@")[0]):
                found.append(name)
    return sorted(set(found))


def main() -> None:
    job = json.loads(Path("loadcheck.json").read_text(encoding="utf-8"))
    import torch  # noqa: F401  (the extension links libtorch; load it the way the worker does)

    from verifier.checks.extspec import load_extension_module

    sys.stdout.flush()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out0 = os.fstat(1).st_size
    threads0, t0 = threading.active_count(), time.monotonic()
    reach_candidate()  # its static initializers run next: the process's words are theirs
    load_extension_module(job["module"], job["path"])
    problems = []
    grew_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    if grew_mb > MAX_IMPORT_MB:
        problems.append(f"its static initializers took {grew_mb:.0f} MB")
    if time.monotonic() - t0 > MAX_IMPORT_S:
        problems.append(f"its import took {time.monotonic() - t0:.0f} s")
    if threading.active_count() > threads0:
        problems.append("its import started threads")
    if os.fstat(1).st_size > out0 + 4096:
        problems.append("its import printed output")
    calls = library_imports(job["path"])
    if calls:  # the bisection leaves the candidate that names them alone with this
        sys.stderr.write("it calls a library's compute by name (a fallback the verifier's trace "
                         f"of forward cannot see): {', '.join(calls[:5])}\n")
        sys.stderr.flush()
        os._exit(1)
    if problems:
        sys.stderr.write("static initializers misbehave: " + "; ".join(problems) + "\n")
        sys.stderr.flush()
        os._exit(1)
    Path("result.json").write_text(json.dumps({"ok": True}), encoding="utf-8")
    os._exit(0)


if __name__ == "__main__":
    main()
