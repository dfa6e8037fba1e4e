"""The persistent worker's ready snapshot, sealed in the parent.

A GPU worker compares what each job left with what it held when it was ready
(`verifier.run.gpu_worker.ReadyState`: immutable, a local of its loop). Candidate code runs in
that process, and ctypes' `PyFrame_LocalsToFast` rebinds any frame's local: a job that left
numpy's `memmove` GOT entry pointed at `memset`, then rebound the loop's `ready` to one whose
libraries' hashes were today's, kept its worker, and a later honest ReLU that copies its result
was "incorrect", the judge's own failure, standing (tests/verifier/test_redteam_round18.py). A
foreign call raises no audit event, so the worker cannot refuse it.

So the parent holds what the worker was ready with: its ready line carries `seal(ready)` (a
digest of the snapshot's contents, computed before any candidate ran), the thread bound and
the identity of its freeze mark (`verifier.run.disarm.note_frozen`). Each settle reply carries
the same three figures as the settle used them; `Sealed.broken` names any that differs, and
the parent treats the job as one that wrote outside the worker's protocol
(`verifier.run.outcome.tampered`): a cheat in a fresh worker, run again in one otherwise.
The thread bound moves as the worker moves it: to a result's `harness_threads` when higher.
Open: a rebinding of the freeze mark to a new list the allocator put where the old one was (its
identity then the same), and any ctypes write into the digest's own code.
"""

from __future__ import annotations

import hashlib
import marshal
from typing import Any


def seal(ready: Any) -> str:
    """A digest of a `ReadyState`'s contents but its thread bound (which moves: `Sealed`): 18 ms
    on the 2-core CI host for torch's ~50k keys (marshal, then blake2b)."""
    fixed = (ready.state, ready.residue, ready.memory, repr(ready.flags),
             tuple((id(fin), name) for fin, name in ready.armed))
    return hashlib.blake2b(marshal.dumps(fixed), digest_size=16).hexdigest()


def figures(ready: Any, mark: Any, next_mark: Any = None) -> dict[str, Any]:
    """What a worker's ready line or settle reply says of the snapshot it compares with."""
    return {"seal": seal(ready), "threads": ready.threads, "mark": id(mark),
            "next_mark": id(mark if next_mark is None else next_mark)}


def _threads(payload: dict[str, Any] | None) -> int:
    """A result's `harness_threads` as the worker reads it (0 where it has none)."""
    try:
        return int((payload or {}).get("harness_threads") or 0)
    except (TypeError, ValueError):
        return 0


class Sealed:
    """The parent's copy of a worker's ready figures (`figures`), moved on at each settle."""

    def __init__(self, ready_line: dict[str, Any]) -> None:
        self.seal = ready_line.get("seal")
        self.threads = ready_line.get("threads")
        self.mark = ready_line.get("next_mark")

    def broken(self, reply: dict[str, Any], payload: dict[str, Any] | None) -> str:
        """Why the snapshot a settle compared with is not the one its worker was ready with
        ("" when it is); the held thread bound and freeze mark move on as the worker's do."""
        if isinstance(self.threads, int):
            self.threads = max(self.threads, _threads(payload))
        said = [name for name, held, now in (
            ("ready snapshot", self.seal, reply.get("seal")),
            ("thread bound", self.threads, reply.get("threads")),
            ("freeze mark", self.mark, reply.get("mark"))) if held is None or held != now]
        self.mark = reply.get("next_mark")
        return ("the worker's " + ", ".join(said) + " changed during the run (the parent "
                "holds what it was ready with)") if said else ""
