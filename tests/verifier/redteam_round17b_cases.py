"""Candidate code for tests/verifier/test_redteam_round17b.py (red-team round 17b: the lead's
own attacks, beside the helper's round 17).

Planted as rounds 12-16 plant residue (the model's `__del__`, after the job's own checks).
"""

from __future__ import annotations

from redteam_round16_cases import GOT_MEMMOVE_IS_MEMSET

# --- the worker's ready snapshot rewritten -------------------------------------------------------
# The hygiene checks compare the process with what the worker saw when it was ready: a local of
# the worker's loop (`ready`), reachable by a frame walk from any code of the job. After leaving
# residue (numpy's `memmove` GOT entry pointed at `memset`), the job takes the loop's `ready`
# and makes its snapshot of the libraries' tables say what they say now: in place where it is a
# dict, by assignment where it is an attribute, so no later check sees a change.
READY_REFRESHED = GOT_MEMMOVE_IS_MEMSET + """
import sys
from verifier.run.tamper import process_state
f = sys._getframe()
while f is not None and "ready" not in f.f_locals:
    f = f.f_back
ready = f.f_locals["ready"]
now = {k: v for k, v in process_state().items() if "GOT" in k and k in ready.residue}
try:
    ready.residue.update(now)
except AttributeError:
    ready.residue = {**dict(ready.residue), **now}
"""

# --- the backend registry rewritten ---------------------------------------------------------------
# Each job of the worker looks its backend up by name (`verifier.backends.get_backend`): the job
# puts its own subclass under every name, whose `synchronize` sleeps 2 ms first (the timed
# windows synchronize after their calls), so every later job's forward is timed slower. In a
# dict registry (main at b4493cd) by an entry; in the registry as module globals, by each.
SLOW_BACKEND = """
import time
from verifier import backends
registry = getattr(backends, "_REGISTRY", None)
names = list(registry) if registry is not None else [
    k[len("_backend_"):] for k in vars(backends) if k.startswith("_backend_")]
for key in names:
    base = backends.backend_class(key)

    class Slow(base):
        def synchronize(self):
            time.sleep(0.002)
            return super().synchronize()
    Slow.__module__, Slow.__qualname__ = base.__module__, base.__qualname__
    if registry is not None:
        registry[key] = Slow
    else:  # the registry as module globals: each one's own
        setattr(backends, "_backend_" + key, Slow)
"""
