"""The C function behind a builtin or a C type's method: what `verifier.run.tamper.identity`
adds to a C callable's identity (C++ can swap it under an unchanged Python object)."""

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
