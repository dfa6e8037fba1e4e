"""Load-check worker (child side, inside the sandbox): import one built extension, report.

Undefined symbols and crashing static initializers of a batch build surface here, before any
candidate of the batch runs; `verifier.build` bisects the batch when the import fails.
Reads `loadcheck.json` ({"module": PyInit name, "path": file}) from its working directory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def main() -> None:
    job = json.loads(Path("loadcheck.json").read_text(encoding="utf-8"))
    import torch  # noqa: F401  (the extension links libtorch; load it the way the worker does)

    from verifier.extspec import load_extension_module

    load_extension_module(job["module"], job["path"])
    Path("result.json").write_text(json.dumps({"ok": True}), encoding="utf-8")
    os._exit(0)


if __name__ == "__main__":
    main()
