"""The names the persistent worker's own checks run through, pinned at ready.

Every check a GPU worker makes between jobs (`verifier.run.gpu_worker._hygiene`, `_settle`) runs
in the process where candidate code ran, and finds each function it calls by name, in its
module's namespace, at the call. The checks compare every such name with the ready snapshot,
but only from inside the functions they call: a job that set the worker module's `_hygiene` to
`lambda *a, **k: False` (no ctypes) was never checked again, its GOT write kept, and a later
honest ReLU that copies its result "incorrect", the judge's own failure standing
(tests/verifier/test_redteam_round19.py). Likewise a harness class's attribute (a `ReadyState`
field made a property that answers the checks with a refreshed snapshot) or a builtin.

So the loop pins, as it is ready, every global of every loaded harness module, every attribute
of their own classes, every builtin and the public functions of the other modules they hold
(the residue check compared its snapshots through `operator.ne`: a job that made it answer
"equal" hid its GOT write, a later honest ReLU "incorrect"), `pin`; and before each check, and
after any step where a job's code can run, it asks `moved` (held in its own locals, as the pins
are) which of them is not as pinned: a harness name moved is a cheat (the checks that would
name it are not run), a builtin or another module's function residue (named with what else the
job left); either way its worker ends. `moved` looks up no name (a global or builtin it looked
up could be the job's): only its locals and the methods of `dict`, `list` and `str`, which no
Python code can rebind; the pins are tuples (a job read the loop's frame and wrote into a list).
Open: a job whose code runs inside the checks (a property of a module's class they read, a
signal handler, a thread) and moves a name only while they run (INSIDE_CHECKS in
tests/verifier/redteam_round19_cases.py); ctypes writes (a function's code, a frame's locals:
the pins are not in the parent's seal); a name not pinned that a check reaches through an
attribute of an attribute (`torch.backends.cudnn.enabled`), rebound for good, is residue only
where the module walk compares it.
"""

from __future__ import annotations

import builtins
import sys
from types import ModuleType
from typing import Any

# namespaces, names, values, and what each is called in a finding (in step); tuples: the loop's
# frame shows them to a job, which wrote its own function into a list of values (the test's
# PINS_EDITED)
Pins = tuple[tuple[Any, ...], tuple[str, ...], tuple[Any, ...], tuple[str, ...]]


def _harness_modules() -> list[Any]:
    main = getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name", "") or ""
    names = [n for n in list(sys.modules) if n.startswith("verifier.")]
    return [sys.modules[n] for n in names] + (
        [sys.modules["__main__"]] if main.startswith("verifier.") else [])


def pin() -> Pins:
    """Every global of every loaded harness module (`verifier.*`, and `__main__` when the worker
    runs one), every attribute of the classes they define, and every builtin."""
    spaces: list[Any] = []
    names: list[str] = []
    values: list[Any] = []
    labels: list[str] = []

    def add(space: Any, owner: str, public_calls: bool = False) -> None:
        for name, value in list(space.items()):
            if public_calls and (name.startswith("_") or not callable(value)):
                continue
            spaces.append(space)
            names.append(name)
            values.append(value)
            labels.append(f"{owner}.{name}")

    add(vars(builtins), "builtins")
    harness = _harness_modules()
    used: dict[int, Any] = {}  # the other modules they hold (`operator`, `os`, `gc`, `torch`)
    for module in harness:
        own = vars(module)
        add(own, module.__name__)
        for value in list(own.values()):
            if isinstance(value, type) and value.__module__ == own.get("__name__"):
                add(value.__dict__, f"{module.__name__}.{value.__qualname__}")  # (a live view)
            elif isinstance(value, ModuleType) and value not in harness and value is not builtins:
                used[id(value)] = value
    # their public functions: what rebinding one does to later jobs is residue, but a
    # comparison made through it would see none
    for module in used.values():
        add(vars(module), module.__name__, public_calls=True)
    return tuple(spaces), tuple(names), tuple(values), tuple(labels)


def moved(pins: Pins, result: dict[str, Any] | None = None,
          missing: Any = object()) -> tuple[list[str], bool]:  # noqa: B008 (a sentinel)
    """The names of `pins` whose namespace holds another object now (or none), and whether one
    is the harness's. With `result` (a job's, or its settle report): a harness name moved makes
    it a cheat (as `after_job` does); a builtin or another module's function is what it left for
    later jobs, an info finding (as `tamper.residue_ends_it` does). Looks up no global and no
    builtin: only the methods of `dict`, `mappingproxy`, `list` and `str` (none rebindable)."""
    spaces, names, values, labels = pins
    out: list[str] = []
    i = -1
    for space in spaces:
        i += 1
        if space.get(names[i], missing) is not values[i]:
            out.append(labels[i])
    harness = False
    for label in out:
        if label.startswith(("verifier.", "__main__.")):
            harness = True
    if not out or result is None:
        return out, harness
    if harness:
        said = "the harness's names moved during the run: " + ", ".join(out[:5])
        result.update(outcome="cheat", error="the candidate changed the harness's process: "
                      + said)
        result["findings"].append({"rule": "patched_function", "severity": "error",
                                   "line": None, "message": said})
        return out, harness
    result["findings"].append({"rule": "worker_replaced", "severity": "info", "line": None,
                               "message": "the run left " + ", ".join(out[:8]) + " changed in "
                               "its worker: its worker was replaced"})
    return out, harness
