"""The persistent worker's audit hook: what a job may not do to the process for later jobs.

- add an audit hook: a hook cannot be removed or listed, and would run the job's code at every
  audited event of every later job;
- rewrite a function that exists already: its code (`fn.__code__ = other`) or its defaults (a
  tuple or dict that was set, made another). The residue check (`verifier.run.tamper.
  process_state`) compares functions by identity where a module's namespace names them; a
  function held only by a C object is named nowhere: numpy's public functions are
  `_ArrayFunctionDispatcher`s around a Python function (`np.clip.__wrapped__`), whose code a
  job rewrote to add 1, and every later job's `np.clip` (an honest ReLU) was "incorrect", the
  judge's own failure (tests/verifier/test_redteam_round18.py). Refused where the new code's
  instructions, constants or names differ from the old code's (torch's dynamo sets
  `code.replace(...)` of a function's own code, the same instructions), and where defaults that
  were set become other objects (dynamo sets them on functions it has just made, from None).
A refused change raises in the job (an error of its own, or nothing where its `__del__` did it).
Open: the same by ctypes (a function's code pointer written in its memory), no audited event;
a closure cell of a function named by no module (`cell_contents` is set with no event; a named
function's cells are compared: `verifier.run.c_identity.identity`).
"""

from __future__ import annotations

import sys
import types
from typing import Any

_CODE_INTS = ("co_argcount", "co_posonlyargcount", "co_kwonlyargcount", "co_nlocals",
              "co_stacksize")
# `types.coroutine` marks a generator function it decorates so (its code replaced with the flag)
CO_ITERABLE_COROUTINE = 0x100


def same_code(old: Any, new: Any) -> bool:
    """Whether code object `new` runs as `old` does: the same instructions, exception table,
    counts and flags, and the very constants and names (by identity: a constant of the job's
    own type could answer any comparison)."""
    table = "co_exceptiontable"  # (3.11+)
    if type(new) is not types.CodeType or new.co_code != old.co_code or (
            getattr(new, table, b"") != getattr(old, table, b"")):
        return False
    flags = (new.co_flags | CO_ITERABLE_COROUTINE) == (old.co_flags | CO_ITERABLE_COROUTINE)
    return flags and all(getattr(new, n) == getattr(old, n) for n in _CODE_INTS) and all(
        len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))
        for a, b in ((new.co_consts, old.co_consts), (new.co_names, old.co_names)))


def same_defaults(old: Any, new: Any) -> bool:
    """Whether defaults `new` are `old` (None: none set yet, any may be set), item by item."""
    if old is None:
        return True
    if type(old) is dict:
        return type(new) is dict and len(new) == len(old) and all(
            type(k) is str and k in old and new[k] is old[k] for k in list(new))
    return type(new) is tuple and len(new) == len(old) and all(
        x is y for x, y in zip(new, old, strict=True))


def rewrites_function(fn: types.FunctionType, name: Any, value: Any) -> bool:
    """Whether setting `name` of `fn` to `value` changes what it runs (`same_code`) or the
    defaults it runs with (`same_defaults`)."""
    if name == "__code__":
        return not same_code(fn.__code__, value)
    if name in ("__defaults__", "__kwdefaults__"):
        return not same_defaults(getattr(fn, name), value)
    return False


def refuse_audit_hooks() -> None:
    """Install an audit hook that refuses every later one and every rewrite of a function's
    code or defaults (`rewrites_function`)."""
    def refuse(event: str, args: tuple[Any, ...]) -> None:
        if event == "object.__setattr__" and type(args[0]) is types.FunctionType and type(
                args[1]) is str and rewrites_function(*args):
            raise RuntimeError(f"rewriting a function's {args[1]} is refused in this process")
        if event == "sys.addaudithook":
            raise RuntimeError("audit hooks are refused in this process")  # the add is dropped

    sys.addaudithook(refuse)
