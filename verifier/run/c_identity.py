"""What a callable is, by identity (`identity`, the residue checks' reader: `verifier.run.
tamper`): a Python function's code, defaults and closure, and the C function behind a builtin
or a C type's method (C++ can swap it under an unchanged Python object)."""

from __future__ import annotations

import types
from typing import Any

# words before the PyMethodDef pointer, by exact type (a class of the candidate's that took
# one of these names must not have arbitrary memory read as a pointer)
_METHOD_DEF_AT = {types.BuiltinFunctionType: 2, types.MethodDescriptorType: 5,
                  types.ClassMethodDescriptorType: 5}


def c_function_pointer(fn: Any) -> int | None:
    """The C function behind a builtin (PyCFunctionObject.m_ml->ml_meth) or a C type's method
    (PyMethodDescrObject.d_method->ml_meth): C++ can swap it while the Python object, and so
    its identity, stays the same (`torch.Tensor.copy_` pointed at `add_`'s function made every
    later job's slot copies additions: tests/verifier/test_redteam_round14.py)."""
    words = _METHOD_DEF_AT.get(type(fn))
    if words is None:
        return None
    import ctypes

    method_def = ctypes.c_void_p.from_address(id(fn) + words * ctypes.sizeof(ctypes.c_void_p)).value
    if not method_def:
        return None
    return ctypes.c_void_p.from_address(method_def + ctypes.sizeof(ctypes.c_void_p)).value


# PyTypeObject (3.11, 3.12: the same words to tp_vectorcall): the words that hold the type's
# own C functions, and its method tables (word: entries) whose entries are C functions
_SLOT_WORDS = (6, 8, 9, 11, 15, 16, 17, 18, 19, 23, 24, 25, 27, 28, 34, 35, 37, 38, 39, 40, 41,
               47, 49, 50)
_TABLES = ((10, 4), (12, 36), (13, 10), (14, 3), (20, 2))  # async, number, sequence, mapping,
_TYPE_WORDS = 51  # buffer


def type_slots(cls: type) -> int:
    """A figure of a type's C slots (`tp_call`, `tp_richcompare`, ...) and of its number,
    sequence, mapping, async and buffer tables: plain memory that C++ or ctypes can repoint
    while every attribute of the type keeps its identity (numpy.ndarray's `nb_add` pointed at
    its `nb_subtract` made every later job's `a + b` a difference:
    tests/verifier/test_redteam_round15.py)."""
    import ctypes
    import struct

    word = ctypes.sizeof(ctypes.c_void_p)
    words = struct.unpack(f"{_TYPE_WORDS}P", ctypes.string_at(id(cls), _TYPE_WORDS * word))
    return hash(tuple(words[i] for i in _SLOT_WORDS) + tuple(
        ctypes.string_at(words[i], n * word) if words[i] else b"" for i, n in _TABLES))


SLOT_MODULES = ("builtins", "numpy", "torch")  # their namespaces' types: every job's operands


def common_type_slots() -> int:
    """`type_slots` of the types in SLOT_MODULES' namespaces (`object` among builtins'), in
    name order: the classes of the walk of `verifier.run.tamper.class_attributes` have theirs
    in its figure."""
    import sys

    out = []
    for name in SLOT_MODULES:
        module = sys.modules.get(name)
        for k, v in sorted(list(namespace(module).items()) if module is not None else ()):
            if type(k) is str and isinstance(v, type):
                out.append((k, type_slots(v)))
    return hash(tuple(out))


_MODULE_DICT = types.ModuleType.__dict__["__dict__"].__get__
_TYPE_DICT = type.__dict__["__dict__"].__get__


def namespace(obj: Any) -> Any:
    """`vars(obj)` as the object's C layout holds it for a module or a class: a module's class
    can be assigned (any ModuleType subclass), and one whose `__dict__` property answered a
    copy taken before the job hid `numpy.where` rebound from every walk of `vars(numpy)`
    (tests/verifier/test_redteam_round15.py)."""
    kind = type(obj)
    if issubclass(kind, types.ModuleType):
        return _MODULE_DICT(obj)
    return _TYPE_DICT(obj) if issubclass(kind, type) else vars(obj)


def identity(fn: Any) -> int:
    """`fn`'s identity and, for a Python function, its code's and defaults' (a function keeps
    its identity when `fn.__code__` is assigned: a harness function so rewritten in one job
    framed the next, tests/verifier/test_redteam_round9.py) and what callables its closure's
    cells hold (a `@contextmanager` method is a closure over its generator function: one put
    in `WorkerPace.trial`'s cell wrote every later job's trial outputs, round 18)."""
    kind = type(fn)  # (`is`: neither type can be subclassed, so it is `isinstance`, faster)
    if kind is types.MethodType:
        return hash((id(fn), identity(fn.__func__)))
    if kind is not types.FunctionType:  # not read through `getattr`: an object that
        meth = c_function_pointer(fn)  # answers any name (unittest.mock.call) answers a new
        return id(fn) if meth is None else hash((id(fn), meth))  # one each time
    cells = fn.__closure__
    return hash((id(fn), id(fn.__code__), id(fn.__defaults__), id(fn.__kwdefaults__),
                 cells and tuple(map(_held_callable, cells))))


def _held_callable(cell: Any) -> int:
    """Identity of what a closure's cell holds where it is callable, else 0 (a counter or a
    cache a library's closure updates is no code)."""
    try:
        held = cell.cell_contents
    except ValueError:  # empty
        return 0
    return id(held) if callable(held) else 0


# the types whose `identity` is more than `id` (none can be subclassed): code, or a C function
CODED = frozenset({types.FunctionType, types.MethodType, types.BuiltinFunctionType,
                    types.MethodDescriptorType, types.ClassMethodDescriptorType})
