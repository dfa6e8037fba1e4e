"""Whether a sandboxed child reached the candidate's code: a byte on a pipe of the parent's.

Both launchers (`verifier.isolation.sandbox.run_sandboxed`, the fork server) give each child the
write end of a fresh pipe, named by `STARTED_FD_ENV`; the child's entry writes one byte on it
and closes it just before the first code of the candidate's runs (`reach_candidate`: the
worker before the candidate's module, the collect run before it, the load check before the
built object's static initializers). The parent reads the pipe when the child has ended.

A run with the byte reached the candidate, and what it said after (its stderr, its exit, its
result file) may be the candidate's words: an extension that prints "FileNotFoundError: ...
/tmp/venv/bin/python" and ends its process says what a hidden interpreter says. A run without
it never got there, so its failure is the interpreter's or the sandbox's. The candidate cannot
take a written byte back, and the descriptor is closed before its code runs
(tests/verifier/test_redteam_round11.py).
"""

from __future__ import annotations

import contextlib
import os

STARTED_FD_ENV = "KS_STARTED_FD"
# the parent's words on a run that reached the candidate's code (`SandboxResult.describe_failure`,
# `candidates_words`): `verifier.isolation.sandbox.common_failure` never counts such a run
REACHED = "after the candidate's code started"


def started_pipe() -> tuple[int, int]:
    """(read end, write end) of a fresh pipe, neither inheritable (pass the write end)."""
    return os.pipe()


def reached(read_fd: int) -> bool:
    """Whether the child wrote its byte (read once it has ended; `read_fd` is closed here)."""
    try:
        os.set_blocking(read_fd, False)
        return bool(os.read(read_fd, 1))
    except BlockingIOError:  # a write end still open somewhere, nothing written
        return False
    finally:
        os.close(read_fd)


def reach_candidate() -> None:
    """Child side: the candidate's code runs next (a no-op outside a sandboxed child)."""
    fd = os.environ.pop(STARTED_FD_ENV, "")
    if not fd.isdigit():
        return
    with contextlib.suppress(OSError):
        os.write(int(fd), b"1")
    with contextlib.suppress(OSError):  # closed before the candidate's code can write on it
        os.close(int(fd))
