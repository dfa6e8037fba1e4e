"""`verifier.run.seal`: the parent's copy of what a persistent worker was ready with, checked at
each settle (the worker's side is `gpu_worker._settle`; the real path: round 18's
`test_a_job_cannot_rebind_the_loops_ready_snapshot`)."""

from __future__ import annotations

import weakref

from verifier.run.gpu_worker import ReadyState
from verifier.run.seal import Sealed, figures, seal


class _Held:  # a finalizer's target
    pass


def _ready(**changed: object) -> ReadyState:
    held = _Held()
    fin = weakref.finalize(held, print)
    base = ReadyState(state=(("verifier.a.f", 11),), flags=(("grad_enabled", True),), threads=2,
                      memory=(1 << 20, 0), armed=((fin, "print"),),
                      residue=(("libc.so.6 (GOT and RELRO pages)", 7),))
    return base._replace(**changed)


def test_the_seal_covers_every_field_but_the_thread_bound() -> None:
    ready = _ready()
    assert seal(ready) == seal(ready._replace())
    assert seal(ready._replace(threads=9)) == seal(ready)
    for field, value in (("state", (("verifier.a.f", 12),)), ("flags", (("grad_enabled", False),)),
                         ("memory", (1 << 21, 0)), ("armed", ()),
                         ("residue", (("libc.so.6 (GOT and RELRO pages)", 8),))):
        assert seal(ready._replace(**{field: value})) != seal(ready), field


def test_an_honest_worker_keeps_its_seal_from_settle_to_settle() -> None:
    """Ready, then two settles: the thread bound rises with a result's `harness_threads` as the
    worker's does, the freeze mark is the one the last settle made."""
    ready, marks = _ready(), [[], [], []]
    held = Sealed(figures(ready, marks[0]))
    ready = ready._replace(threads=max(ready.threads, 5))  # the worker's loop after a job
    assert held.broken(figures(ready, marks[0], marks[1]), {"harness_threads": 5}) == ""
    assert held.broken(figures(ready, marks[1], marks[2]), {"harness_threads": "3"}) == ""
    assert held.broken(figures(ready, marks[2], marks[2]), None) == ""


def test_a_settle_on_another_snapshot_is_named() -> None:
    """The residue rebound (round 18's ctypes route), the thread bound raised to hide a thread
    a job left, the freeze mark swapped for a fresh list: each is named; a reply without the
    figures (a worker that did not say them) is broken too."""
    ready, mark, other = _ready(), [], []
    cases = {"ready snapshot": figures(ready._replace(residue=()), mark, other),
             "thread bound": figures(ready._replace(threads=64), mark, other),
             "freeze mark": figures(ready, other, other)}
    for said, reply in cases.items():
        why = Sealed(figures(ready, mark)).broken(reply, {"harness_threads": 2})
        assert said in why and "changed during the run" in why, (said, why)
        assert [n for n in cases if n in why] == [said], why
    why = Sealed(figures(ready, mark)).broken({"settled": True}, {})
    assert all(n in why for n in cases), why
