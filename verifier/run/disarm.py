"""What a job left alive that would run code when it dies, made unable to die in a later job of
the persistent worker (`verifier.run.settle.leftover_code`, at the job's settle, its garbage
collected).

An object the job leaves alive past its settle dies whenever the last reference to it goes:
perhaps in a later job, an honest sibling's, when its harness drops the object that held it
(the settle's message in the worker's loop, dropped as the next job's is read, was such an
anchor: tests/verifier/test_redteam_later_code.py). What runs then is the job's code: a
`weakref.finalize` callback (torch's own `_del_library` runs whatever `on_destroy` the
handles it is given hold: no check of a finalizer's function and data could tell), a weak
reference's callback, a `__del__` (of the job's class, or of a generator suspended in its
`try`). So at the settle every finalizer is detached, whatever its function (torch's too: a
`Library` a job keeps alive is never deregistered then, and its registrations are residue
already, `verifier.run.tamper._py_kernels`), and every object created since the last settle
that has a `__del__`, and every live referent of a weak reference among them with a callback,
is held until the worker exits (`PINNED`): none of them dies in a later job.

The scan lists the objects made since the harness last froze the collector's generations
(`note_frozen`); a job that froze its own objects (`gc.freeze()`) moved them out of that list,
and then every object is scanned (`gc.unfreeze()` first: 0.17 s for a warm cpu worker's 290k
objects on the 2-core CI host). The job's freeze is seen by a mark, not by a count: a list the
harness makes just after each of its own freezes (`note_frozen`'s) stays listed by
`gc.get_objects()` until the next `gc.freeze()`, whoever calls it (objects leave the collector's
generations for its permanent one only there: `gc.collect` moves them between generations 0-2,
all listed), so a mark missing from the list is a freeze since; lists are never untracked. (The
permanent generation's size, `gc.get_freeze_count()`, was compared before: a walk of its 290k
objects, 30 ms, twice a settle; a job that let as many frozen objects die as it froze hid its
freeze.) The mark is held by the worker's loop in a local and passed down, never in data of a
module: a job that froze its object and wrote a fresh list over such a global (`MARK[0]`)
hid its freeze (tests/verifier/test_redteam_round16.py). A job that rebinds the loop frame's
local: with a trace function (its `f_locals` written back into its frame on 3.11) it is
refused (`verifier.run.audit`); with ctypes (`PyFrame_LocalsToFast`) the settle reports the
mark's identity to the parent, which holds the one the last settle made (`verifier.run.seal`).
Open: a fresh list the allocator puts where the old mark was freed (its identity the same).
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

from verifier.run.mortal import mortal_of, stack_roots

# what earlier jobs left that would run code as it dies: held for the worker's life
PINNED: list[Any] = []


def note_frozen(freeze: bool = True) -> list[Any]:
    """Freeze what lives now (`freeze`: the worker's ready froze it already); the mark that a
    later freeze moves out of the collector's lists (the caller holds it, in a local)."""
    if freeze:
        gc.freeze()
    return []


def frozen_since(mark: list[Any] | None) -> bool:
    """Whether `gc.freeze()` ran since the `note_frozen` that made `mark` (no longer among the
    objects the collector lists: young objects only, not the frozen ones); with no mark, True
    (nothing tells: every object is scanned)."""
    return mark is None or not any(obj is mark for obj in gc.get_objects())


def detach_all() -> list[tuple[Any, Any]]:
    """Detach every live `weakref.finalize`, the harness's and torch's too (between jobs none
    has work left: the objects of the harness's jobs are gone, torch's live as long as the
    worker, and a job can rewrite any entry's `func`): (finalizer, registry entry) each."""
    registry = weakref.finalize._registry  # type: ignore[attr-defined]
    found = list(registry.items())
    for fin, _ in found:
        fin.detach()
    return found


def pin_mortal(mark: list[Any] | None, skip: tuple[Any, ...] = ()) -> int:
    """Hold every object the collector lists (those created since the last `gc.freeze`, `mark`
    made then), or that they or any frame's locals hold untracked, that runs code as it dies,
    and the live referent of every weak reference among them with a callback, as the
    interpreter reads them (`verifier.run.mortal`: a metaclass that denied `__del__`, a
    shadowed `__callback__`, an object taken out of the collector's lists and a capsule's C
    destructor each hid one: tests/verifier/test_redteam_round17.py; `skip`: the harness's
    own immutable objects, not walked); how many were pinned."""
    if frozen_since(mark):
        gc.unfreeze()  # the job froze objects itself: listed only once unfrozen
    held = mortal_of(gc.get_objects() + stack_roots(), skip)
    PINNED.extend(held)
    return len(held)
