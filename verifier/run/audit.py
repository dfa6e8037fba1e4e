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


# Every name the hook reads at an event is bound as it is made (its functions' defaults, which
# it refuses to rewrite): a job that set this module's `rewrites_function` to one answering "no"
# while it gave numpy's hidden `np.clip` implementation its own code, then put it back, had the
# rewrite allowed, every later honest `np.clip` ReLU "incorrect" (the transient rebinding left
# nothing for the pins to find: tests/verifier/test_redteam_round19.py). A tuple: nothing
# rebinds its items.
_BOUND = (type, getattr, all, len, zip, dict, tuple, list, str, any, frozenset)


def same_code(old: Any, new: Any, _code: Any = types.CodeType, _ints: Any = _CODE_INTS,
              _flag: int = CO_ITERABLE_COROUTINE, _b: Any = _BOUND) -> bool:
    """Whether code object `new` runs as `old` does: the same instructions, exception table,
    counts and flags, and the very constants and names (by identity: a constant of the job's
    own type could answer any comparison)."""
    kind, get, every, size, pairs = _b[:5]
    table = "co_exceptiontable"  # (3.11+)
    if kind(new) is not _code or new.co_code != old.co_code or (
            get(new, table, b"") != get(old, table, b"")):
        return False
    flags = (new.co_flags | _flag) == (old.co_flags | _flag)
    return flags and every(get(new, n) == get(old, n) for n in _ints) and every(
        size(a) == size(b) and every(x is y for x, y in pairs(a, b, strict=True))
        for a, b in ((new.co_consts, old.co_consts), (new.co_names, old.co_names)))


def same_defaults(old: Any, new: Any, _b: Any = _BOUND) -> bool:
    """Whether defaults `new` are `old` (None: none set yet, any may be set), item by item."""
    kind, _, every, size, pairs, a_dict, a_tuple, a_list, a_str = _b[:9]
    if old is None:
        return True
    if kind(old) is a_dict:
        return kind(new) is a_dict and size(new) == size(old) and every(
            kind(k) is a_str and k in old and new[k] is old[k] for k in a_list(new))
    return kind(new) is a_tuple and size(new) == size(old) and every(
        x is y for x, y in pairs(new, old, strict=True))


def rewrites_function(fn: types.FunctionType, name: Any, value: Any, _code: Any = same_code,
                      _defaults: Any = same_defaults, _get: Any = getattr) -> bool:
    """Whether setting `name` of `fn` to `value` changes what it runs (`same_code`) or the
    defaults it runs with (`same_defaults`)."""
    if name == "__code__":
        return not _code(fn.__code__, value)
    if name in ("__defaults__", "__kwdefaults__"):
        return not _defaults(_get(fn, name), value)
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


def harness_profile(caller: Any, setters: tuple[Any, ...], counter: Any,
                    _fn: Any = types.FunctionType, _b: Any = _BOUND) -> bool:
    """Whether the `sys.setprofile` that `caller` (a frame) makes is the harness's: from one
    of `setters`, its `profile` None or an `own_counter` function with its own defaults."""
    kind, get, every, size, _, _, a_tuple, a_list, a_str, some, a_set = _b
    if not some(caller.f_code is c for c in setters):
        return False
    fn = caller.f_locals.get("profile")
    if fn is None:
        return True
    d = fn.__defaults__ if kind(fn) is _fn and fn.__code__ is counter else None
    return kind(d) is a_tuple and size(d) == 5 and kind(d[0]) is a_list and kind(
        d[1]) is a_set and every(kind(m) is a_str for m in d[1]) and (
        d[2] is kind and d[3] is a_str and d[4] is get) and not (
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
               counter: Any = counter, _kind: Any = type, _fn: Any = types.FunctionType,
               _str: Any = str, _rewrites: Any = rewrites_function, _error: Any = RuntimeError,
               _profile: Any = harness_profile, _frame: Any = sys._getframe) -> None:
        if event == "object.__setattr__" and _kind(args[0]) is _fn and _kind(
                args[1]) is _str and _rewrites(*args):
            raise _error(f"rewriting a function's {args[1]} is refused in this process")
        if event == "sys.addaudithook":
            raise _error("audit hooks are refused in this process")  # the add is dropped
        if event in ("sys.settrace", "sys.setprofile") and not (
                event == "sys.setprofile" and _profile(_frame(1), setters, counter)):
            raise _error(f"{event} is refused in this process (but the harness's own)")

    sys.addaudithook(refuse)
