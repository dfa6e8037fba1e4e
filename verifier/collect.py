"""Collect worker (child side, inside the sandbox): run a candidate module to record its builds.

`torch.utils.cpp_extension.load_inline` / `load` are replaced by a recorder before the module
runs, so nothing is compiled; the recorded calls go to `result.json` as ExtensionSpec dicts.
Used only when the load_inline arguments are not literals (`extspec.specs_from_source`).
"""

from __future__ import annotations

import json
import os
import traceback
import types
from pathlib import Path


def main() -> None:
    code = Path("candidate.py").read_text(encoding="utf-8")
    from verifier.extspec import ExtensionSpec, install_recorder

    sink: list[ExtensionSpec] = []
    install_recorder(sink)
    module = types.ModuleType("candidate")
    module.__file__ = "candidate.py"
    error, line = "", None
    try:
        exec(compile(code, "candidate.py", "exec"), module.__dict__)
    except BaseException as exc:  # the module's own failure is the verdict, not ours
        for fr in traceback.extract_tb(exc.__traceback__):
            if fr.filename == "candidate.py":
                line = fr.lineno
        error = f"{type(exc).__name__}: {exc}"[:2000]
    result = {"specs": [s.to_dict() for s in sink], "error": error, "line": line}
    Path("result.json").write_text(json.dumps(result), encoding="utf-8")
    os._exit(0)


if __name__ == "__main__":
    main()
