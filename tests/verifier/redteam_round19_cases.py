"""Candidate code for tests/verifier/test_redteam_round19.py (red-team round 19).

Planted as rounds 12-18 plant residue: `redteam_round14_cases.leaving(honest, CODE)`, CODE run
by the honest model's `__del__`, after the job's own checks.
"""

from __future__ import annotations

from redteam_round18_cases import CLIP_CODE

# --- the worker loop's own hygiene function rebound ------------------------------------------------
# `_settle` and the loop call `_hygiene` (a global of `__main__`, the worker's module) by name:
# the checks that would see it rebound run inside it.
HYGIENE_REBOUND = """
import sys
sys.modules["__main__"]._hygiene = lambda *a, **k: False
"""

# --- a field of the loop's `ReadyState` class answered by a property -------------------------------
# `ready` (an immutable tuple, held in the loop's locals, its digest in the parent) is read
# through its class's field descriptors: the job makes `ReadyState.residue` a property that
# answers the checks (a `_hygiene` frame up the stack) with today's GOT figures and anyone
# else (the seal's digest) with the tuple's own.
READY_FIELD = """
import sys
from verifier.run.tamper import process_state
main = sys.modules["__main__"]
field = main.ReadyState.residue


def residue(self):
    f = sys._getframe(1)
    while f is not None and f.f_code.co_name != "_hygiene":
        f = f.f_back
    held = field.__get__(self)
    if f is None:
        return held
    now = process_state()
    return tuple((k, now.get(k, v) if "GOT" in k else v) for k, v in held)


main.ReadyState.residue = property(residue)
"""

# --- code run inside the checks, a name moved only while they run -------------------------------------
# torch's `torch.backends.cudnn` is a module of torch's own class, whose `enabled` the worker's
# `global_flags` reads at every check. The job gives the module a subclass of that class (a
# module's `__class__` may be set) whose `enabled` runs its code: when read by a settle's
# checks, it sets the worker module's `residue_ends_it` to a function that puts the real one
# back and finds nothing. Between and after the checks every name is as pinned.
INSIDE_CHECKS = """
import sys
import torch.backends.cudnn
mod = sys.modules["torch.backends.cudnn"]
main = sys.modules["__main__"]
base, real = type(mod), main.residue_ends_it


def fake(result, residue):
    main.residue_ends_it = real
    return False


def enabled(self):
    f = sys._getframe(1)
    while f is not None and not (f.f_code.co_name == "_hygiene" and f.f_locals.get("settling")):
        f = f.f_back
    if f is not None:
        main.residue_ends_it = fake
    return vars(base)["enabled"].__get__(self, base)


mod.__class__ = type(base.__name__, (base,), {"enabled": property(enabled)})
"""

# --- a decoy of a library, mapped below it ----------------------------------------------------------
# `relocations._objects` keys each ELF file by its first mapping from offset 0, in the order of
# /proc/self/maps (by address). Before its GOT write the job saves numpy's `_multiarray_umath`
# as mapped (DECOY_SAVED: its GOT as the dynamic linker wrote it); after it, it puts that copy
# at a lower address and maps the file's first page (ELF magic) over the copy's (DECOY_MAPPED):
# the residue check then hashes the copy's GOT, as it was.
DECOY_SAVED = """
import ctypes, os
spans, path = [], None
for ln in open("/proc/self/maps"):
    p = ln.split()
    if len(p) >= 6 and "_multiarray_umath" in p[5] and (path is None or p[5] == path):
        path = p[5]
        lo, hi = (int(x, 16) for x in p[0].split("-"))
        spans.append((lo, hi, ctypes.string_at(lo, hi - lo) if p[1][0] == "r" else None))
"""
DECOY_MAPPED = """
libc = ctypes.CDLL(None)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                      ctypes.c_long]
base, top, at = spans[0][0], spans[-1][1], 0x200000000
while libc.mmap(at, top - base, 3, 0x22 | 0x100000, -1, 0) != at:  # anonymous, FIXED_NOREPLACE
    at += 0x100000000
for lo, hi, data in spans:
    if data is not None:
        ctypes.memmove(at + lo - base, data, hi - lo)
fd = os.open(path, os.O_RDONLY)
assert libc.mmap(at, 4096, 1, 0x02 | 0x10, fd, 0) == at  # MAP_PRIVATE | MAP_FIXED
os.close(fd)
"""

# --- the comparison the residue check makes, answered "equal" ----------------------------------------
# `tamper.left_in_process` finds the keys whose values differ with `map(operator.ne, ...)`,
# `operator` being the standard module: its `ne` made a function that finds nothing different
# blinds the one check that would see it rebound (the module walk compares `operator.ne` too).
NE_BLIND = """
import operator
operator.ne = lambda a, b: False
"""

# --- the loop's pins edited: the names as the job moved them -----------------------------------------
# The pins are in the loop's locals (no ctypes reaches those to rebind them), but what they hold
# is read through its frame: the job sets its own `_hygiene` in the module, then writes it into
# the pinned values.
PINS_EDITED = """
import sys
main = sys.modules["__main__"]
f = sys._getframe()
while f is not None and "pins" not in f.f_locals:
    f = f.f_back
spaces, names, values = f.f_locals["pins"][:3]


def fake(*a, **k):
    return False


main._hygiene = fake
for i, name in enumerate(names):
    if name == "_hygiene" and spaces[i] is vars(main):
        values[i] = fake
"""

# --- the audit hook's own helper rebound while the job rewrites a function -----------------------
# The worker's audit hook (`verifier.run.audit.refuse_audit_hooks`) asks its module's
# `rewrites_function` at each event, by name: the job makes it answer "no" for as long as it
# gives numpy's hidden `np.clip` implementation its own code (round 18's CLIP_CODE), then puts
# it back. Every name is as pinned again when the checks come.
AUDIT_HELPER = """
from verifier.run import audit
helper = audit.rewrites_function
audit.rewrites_function = lambda *a: False
try:
""" + "".join("    " + line + "\n" for line in CLIP_CODE.strip().splitlines()) + """
finally:
    audit.rewrites_function = helper
"""
