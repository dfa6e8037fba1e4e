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


def harness_codes() -> tuple[tuple[Any, ...], Any]:
    """The code of the harness's calls of `sys.setprofile` (`fallback.make_trace_mode`'s
    `__enter__` and `__exit__`), and that of the only profile they may set (`own_counter`'s)."""
    from verifier.checks import fallback

    def nested(code: Any) -> list[Any]:
        inner = [c for c in code.co_consts if type(c) is types.CodeType]
        return inner + [d for c in inner for d in nested(c)]

    setters = tuple(c for c in nested(fallback.make_trace_mode.__code__)
                    if c.co_name in ("__enter__", "__exit__"))
    counter = [c for c in nested(fallback.own_counter.__code__) if c.co_name == "count"]
    assert len(setters) == 2 and len(counter) == 1, (setters, counter)
    return setters, counter[0]


def harness_profile(caller: Any, setters: tuple[Any, ...], counter: Any) -> bool:
    """Whether the `sys.setprofile` that `caller` (a frame) makes is the harness's: from one
    of `setters`, its `profile` None or an `own_counter` function with its own defaults."""
    if not any(caller.f_code is c for c in setters):
        return False
    fn = caller.f_locals.get("profile")
    if fn is None:
        return True
    d = fn.__defaults__ if type(fn) is types.FunctionType and fn.__code__ is counter else None
    return type(d) is tuple and len(d) == 5 and type(d[0]) is list and type(
        d[1]) is frozenset and all(type(m) is str for m in d[1]) and d[2:] == (type, str, getattr
                                                                                ) and not (
        fn.__closure__ or fn.__kwdefaults__)


def refuse_audit_hooks() -> None:
    """Install an audit hook that refuses every later one, every rewrite of a function's
    code or defaults (`rewrites_function`), and every trace or profile function but the
    harness's own (`harness_profile`): the interpreter writes a trace or profile function's
    `frame.f_locals` back into the frame it was called for, and a job's trace function rebound
    the worker loop's `ready` snapshot (its GOT write then unseen, a later honest ReLU
    "incorrect": tests/verifier/test_redteam_round18.py). Not refused: ctypes'
    `PyFrame_LocalsToFast` (a foreign call raises no audit event in 3.11); the parent holds what
    `ready` was (`verifier.run.seal`)."""
    setters, counter = harness_codes()

    def refuse(event: str, args: tuple[Any, ...], setters: tuple[Any, ...] = setters,
               counter: Any = counter) -> None:
        if event == "object.__setattr__" and type(args[0]) is types.FunctionType and type(
                args[1]) is str and rewrites_function(*args):
            raise RuntimeError(f"rewriting a function's {args[1]} is refused in this process")
        if event == "sys.addaudithook":
            raise RuntimeError("audit hooks are refused in this process")  # the add is dropped
        if event in ("sys.settrace", "sys.setprofile") and not (
                event == "sys.setprofile" and harness_profile(sys._getframe(1), setters,
                                                              counter)):
            raise RuntimeError(f"{event} is refused in this process (but the harness's own)")

    sys.addaudithook(refuse)
