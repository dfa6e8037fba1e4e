"""Collect worker (child side, inside the sandbox): run a candidate module to record its builds.

`torch.utils.cpp_extension.load_inline` / `load` are replaced by a recorder before the module
runs, so nothing is compiled; the recorded calls go to `result.json` as ExtensionSpec dicts.
Used only when the load_inline arguments are not literals (`extspec.specs_from_source`).
When the task is given (`task.py`), its `get_init_inputs()` is computed first and the file
deleted; after the module ran, `ModelNew(*init_inputs)` is constructed too, so extensions
compiled inside `__init__` (or in a helper it calls) are recorded (built on the meta device when
it can be: `construct_for_discovery`).
"""

from __future__ import annotations

import json
import os
import traceback
import types
from pathlib import Path

from verifier.isolation.started import reach_candidate


def main() -> None:
    code = Path("candidate.py").read_text(encoding="utf-8")
    from verifier.checks.extspec import ExtensionSpec, install_recorder
    from verifier.checks.namespace import candidate_globals

    init_inputs, init_error = None, ""
    task = Path("task.py")
    ref: dict = {}
    if task.is_file():
        ref["__name__"] = "ks_reference"
        try:
            exec(compile(task.read_text(encoding="utf-8"), "reference.py", "exec"), ref)
            init_inputs = list(ref["get_init_inputs"]())
        except Exception as exc:  # the task's fault; the module run still records its calls
            init_error = f"get_init_inputs failed: {type(exc).__name__}: {exc}"
        task.unlink()

    sink: list[ExtensionSpec] = []
    install_recorder(sink)
    module = types.ModuleType("candidate")
    module.__file__ = "candidate.py"
    error, line = "", None
    reach_candidate()  # the parent's pipe: what the run says from here may be the candidate's
    try:
        # discovery only: the reference's names, so a kernelbench-mode candidate's module runs
        # here; the worker gives the candidate the namespace its options say
        module.__dict__.update(candidate_globals(ref, "kernelbench"))
        exec(compile(code, "candidate.py", "exec"), module.__dict__)
        model_new = module.__dict__.get("ModelNew")
        if init_inputs is not None and isinstance(model_new, type):
            construct_for_discovery(model_new, init_inputs, sink)
    except BaseException as exc:  # the module's own failure is the verdict, not ours
        for fr in traceback.extract_tb(exc.__traceback__):
            if fr.filename == "candidate.py":
                line = fr.lineno
        error = f"{type(exc).__name__}: {exc}"[:2000]
    result = {"specs": [s.to_dict() for s in sink], "error": error, "line": line,
              "init_error": init_error}
    Path("result.json").write_text(json.dumps(result), encoding="utf-8")
    os._exit(0)


def construct_for_discovery(model_new: type, init_inputs: list, sink: list) -> None:
    """`ModelNew(*init_inputs)` for its load_inline calls: on the meta device (a level-3
    model's GBs of weights are never drawn, `verifier.judge.construct`), else on the host as
    KernelBench builds it (an init that reads values: `.numpy()`, `.item()`, a branch on a
    weight), its calls recorded once."""
    from verifier.judge.construct import HOST, build

    recorded = len(sink)
    try:
        build(model_new, init_inputs, 0, "meta")
    except Exception:  # noqa: BLE001 - needs real values: the host's build says the rest
        del sink[recorded:]
        build(model_new, init_inputs, 0, "cpu", HOST)


if __name__ == "__main__":
    main()
