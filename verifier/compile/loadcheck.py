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
import resource
import sys
import threading
import time
from pathlib import Path

MAX_IMPORT_MB = 256  # peak resident memory an import may add
MAX_IMPORT_S = 10.0


def main() -> None:
    job = json.loads(Path("loadcheck.json").read_text(encoding="utf-8"))
    import torch  # noqa: F401  (the extension links libtorch; load it the way the worker does)

    from verifier.checks.extspec import load_extension_module

    sys.stdout.flush()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out0 = os.fstat(1).st_size
    threads0, t0 = threading.active_count(), time.monotonic()
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
    if problems:
        sys.stderr.write("static initializers misbehave: " + "; ".join(problems) + "\n")
        sys.stderr.flush()
        os._exit(1)
    Path("result.json").write_text(json.dumps({"ok": True}), encoding="utf-8")
    os._exit(0)


if __name__ == "__main__":
    main()
