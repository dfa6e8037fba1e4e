"""Which objects run code as they die, read as the interpreter reads them (red-team round 17:
tests/verifier/test_redteam_round17.py).

`verifier.run.disarm.pin_mortal` holds, at each settle, every object the collector lists whose
type has a `__del__` and the referent of every listed weak reference with a callback, so that
none dies in a later job. It asked Python: `hasattr(kind, "__del__")` (a metaclass whose
`__getattribute__` denies `__del__` answers False; the type's C slot `tp_finalize`, set from
the class body, still runs it) and `obj.__callback__` (a subclass's class attribute
`__callback__ = None` shadows the member; the C slot still holds the callback); and it saw
only what the collector lists (an object taken out of its lists by `PyObject_GC_UnTrack` is
not), nor a capsule (`PyCapsule_New`, never listed) whose C destructor is a ctypes callback.
Each hid code hung on the settle's message in the worker's loop, which ran as the next job
began. `mortal_of` answers from the C slots, walks the untracked objects the listed ones hold,
and holds each capsule they hold that has a destructor; the scan's objects are what the
collector lists and the locals of every frame (`stack_roots`: the loop's message is an
untracked dict when it holds only a capsule).
"""

from __future__ import annotations

import ctypes
import gc
import sys
import weakref
from collections.abc import Iterable
from typing import Any

_WORD = ctypes.sizeof(ctypes.c_void_p)
_MRO = type.__dict__["__mro__"].__get__  # the type's own, whatever its metaclass answers
_DICT = type.__dict__["__dict__"].__get__
_CALLBACK = weakref.ReferenceType.__dict__["__callback__"].__get__  # the C member's reader
WALK_MAX = 1_000_000  # untracked objects walked at most per scan
_HAVE_GC = 1 << 14  # Py_TPFLAGS_HAVE_GC
_API = ctypes.PyDLL(None)  # its own function objects: `ctypes.pythonapi`'s argtypes are shared
_capsule_new = _API.PyCapsule_New
_capsule_new.restype, _capsule_new.argtypes = ctypes.py_object, [ctypes.c_void_p,
                                                                ctypes.c_char_p, ctypes.c_void_p]
CAPSULE = type(_capsule_new(1, None, None))  # (not a collected type: never listed)
_destructor = _API.PyCapsule_GetDestructor
_destructor.restype, _destructor.argtypes = ctypes.c_void_p, [ctypes.py_object]


class _Dies:
    def __del__(self) -> None:
        pass


def _slot_words() -> tuple[int, ...]:
    """Words of PyTypeObject that are `tp_del` and `tp_finalize` (3.11, 3.12: 47 and 49),
    checked on a class with a `__del__` and one without; () where they do not check out."""
    words = (47, 49)

    def at(cls: type, i: int) -> int:
        return ctypes.c_void_p.from_address(id(cls) + i * _WORD).value or 0

    if at(_Dies, 49) and not any(at(cls, i) for cls in (object, int) for i in words):
        return words
    return ()


SLOT_WORDS = _slot_words()


def dies_with_code(kind: type) -> bool:
    """Whether the interpreter runs code as an object of `kind` dies: a C finalizer slot set,
    or a `__del__` in the dict of a class of its own MRO."""
    if any(ctypes.c_void_p.from_address(id(kind) + i * _WORD).value for i in SLOT_WORDS):
        return True
    return any("__del__" in _DICT(c) for c in _MRO(kind) if isinstance(c, type))


def weak_callback(ref: Any) -> Any:
    """The callback a weak reference holds in C (None when it has none)."""
    return _CALLBACK(ref)


def mortal_of(objects: Iterable[Any], skip: Iterable[Any] = ()) -> list[Any]:
    """What of `objects` (the collector's listing), and of the untracked objects of collected
    types they hold (and those hold), runs code as it dies: each object whose type
    `dies_with_code`, the live referent of each weak reference with a callback, and each
    capsule they hold that has a destructor; each once. `skip`: untracked objects not walked
    (the worker's ready snapshot: immutable tuples made before any job, 40k pairs a settle
    walked for nothing, ~100 ms on the 2-core CI host)."""
    has: dict[type, bool] = {}
    held: list[Any] = []
    seen: set[int] = set(map(id, skip))
    stack, walked = list(objects), 0
    while stack:
        obj = stack.pop()
        kind = type(obj)
        if kind not in has:
            has[kind] = dies_with_code(kind)
        if has[kind]:
            held.append(obj)
        if isinstance(obj, weakref.ReferenceType) and weak_callback(obj) is not None:
            target = obj()
            if target is not None:
                held.append(target)
        for r in gc.get_referents(obj) if walked < WALK_MAX else ():
            if type(r) is CAPSULE and _destructor(r):  # a C function runs as it dies
                held.append(r)
            # an untracked object of a collected type: auto-untracked tuples and dicts of
            # atomic values, or one a job took out of the collector's lists
            if type(r).__flags__ & _HAVE_GC and not gc.is_tracked(r) and id(r) not in seen:
                seen.add(id(r))
                stack.append(r)
                walked += 1
    return list({id(x): x for x in held}.values())


_OPTIMIZED = 0x1  # CO_OPTIMIZED: a function's frame (its f_locals a snapshot, not its globals)


def stack_roots() -> list[Any]:
    """The locals of every frame of every thread (the worker's loop's message among them: an
    untracked dict, never listed, that dies as the next message comes), each a copy; a
    function frame's snapshot of its locals is cleared after (it would hold them on)."""
    roots: list[Any] = []
    for top in list(sys._current_frames().values()):
        f: Any = top
        while f is not None:
            snap = f.f_locals
            roots.append(dict(snap))
            if f.f_code.co_flags & _OPTIMIZED:
                snap.clear()
            f = f.f_back
    return roots
