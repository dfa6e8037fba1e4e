"""What a job left alive that would run code when it dies, made unable to die in a later job of
the persistent worker (`verifier.run.settle.leftover_code`, at the job's settle, its garbage
collected).

An object the job leaves alive past its settle dies whenever the last reference to it goes:
perhaps in a later job, an honest sibling's, when its harness replaces the object that held
it (`tempfile`'s name generator, replaced as the next job's folder is made, was such an
anchor: tests/verifier/test_redteam_later_code.py). What runs then is the job's code: a
`weakref.finalize` callback (torch's own `_del_library` runs whatever `on_destroy` the
handles it is given hold: no check of a finalizer's function and data could tell), a weak
reference's callback, a `__del__` (of the job's class, or of a generator suspended in its
`try`). So at the settle every finalizer is detached, whatever its function (torch's too: a
`Library` a job keeps alive is never deregistered then, and its registrations are residue
already, `verifier.run.tamper._py_kernels`), and every object created since the
last settle that has a `__del__`, and every live referent of such a weak reference with a
callback, is held until the worker exits (`PINNED`): none of them dies in a later job.

Open (tests/verifier/test_redteam_later_code.py, a strict xfail): objects the job moved to the
collector's permanent generation itself (`gc.freeze()`) are not listed by `gc.get_objects()`.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

# what earlier jobs left that would run code as it dies: held for the worker's life
PINNED: list[Any] = []


def detach_all() -> list[tuple[Any, Any]]:
    """Detach every live `weakref.finalize`, the harness's and torch's too (between jobs none
    has work left: the objects of the harness's jobs are gone, torch's live as long as the
    worker, and a job can rewrite any entry's `func`): (finalizer, registry entry) each."""
    registry = weakref.finalize._registry  # type: ignore[attr-defined]
    found = list(registry.items())
    for fin, _ in found:
        fin.detach()
    return found


def pin_mortal() -> int:
    """Hold every object the collector lists (those created since the last `gc.freeze`) that
    has a `__del__`, and the live referent of every weak reference among them with a
    callback; how many were pinned."""
    has_del: dict[type, bool] = {}
    held = []
    for obj in gc.get_objects():
        kind = type(obj)
        if kind not in has_del:
            has_del[kind] = hasattr(kind, "__del__")
        if has_del[kind]:
            held.append(obj)
        if isinstance(obj, weakref.ReferenceType) and obj.__callback__ is not None:
            target = obj()
            if target is not None:
                held.append(target)
    PINNED.extend(held)
    return len(held)
