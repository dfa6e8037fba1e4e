"""The worker's end of the judge's clock (`verifier.judge.clock`): it runs in the candidate's
process, so it only serves the judge's windows and reports nothing. The pipes are FIFOs in a
sandboxed run's directory (`REQ`, `GO`) or a persistent worker's inherited pipe ends
(`FDS_ENV`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

REQ, GO = "clock.req", "clock.go"
FDS_ENV = "KS_CLOCK_FDS"  # a persistent worker's inherited pipe ends: "<req write>,<go read>"


def read_line(fd: int, size: int = 1) -> str:
    """One line from a clock pipe (OSError once the judge closed it): one byte at a time, or
    `size` bytes where every line the judge may send then is that long."""
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = os.read(fd, max(1, size - len(buf)))
        if not chunk:
            raise OSError("the verifier's clock pipe closed")
        buf += chunk
    return buf.decode()


def open_worker_pipes() -> tuple[int, int] | None:
    """(write, read) ends of the clock pipes, or None where the judge made none."""
    fds = os.environ.get(FDS_ENV, "")
    if fds:
        w, r = (os.dup(int(f)) for f in fds.split(","))
        return w, r
    if os.path.exists(REQ):
        return os.open(REQ, os.O_WRONLY), os.open(GO, os.O_RDONLY)
    return None


class RefusedOutput(ValueError):
    """A timed call returned what the harness does not copy into the judge's slot."""


def _plain(out: Any) -> bool:
    """Whether every tensor of `out` is exactly a torch.Tensor (no subclass)."""
    import torch

    if isinstance(out, list | tuple):
        return all(_plain(x) for x in out)
    return not isinstance(out, torch.Tensor) or type(out) is torch.Tensor


def write_all(fd: int, data: bytes) -> None:
    """All of `data` into the pipe `fd` (a write larger than the pipe's buffer may be partial)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def serve_windows(pipes: tuple[int, int], call: Callable[..., Any], sets: list[list[Any]],
                  put: Callable[[int, Any], None], synchronize: Callable[[], None],
                  report: bytes = b"") -> None:
    """Serve the judge's windows until it says "e": n calls over `sets`, `put(i, out)` each
    call's output into its slot, synchronize, "d". A stepped window ("s n",
    `verifier.judge.stepped`): after each call but the last, "c", and the next call once the
    judge says "g" (its set is in the arena only then). `report`: the trials' report, sent
    with "t" ("t <bytes>" and the bytes): the judge checks the trials before any window, and
    where they failed it says "e" at once (`verifier.judge.trial_pace.trials_checked`)."""
    wfd, rfd = pipes
    try:
        write_all(wfd, f"t {len(report)}\n".encode() + report if report else b"t\n")
        while True:
            msg = read_line(rfd).split()
            if msg == ["e"]:
                return
            n, stepped = int(msg[1]), msg[0] == "s"
            for i in range(n):
                if stepped and i:
                    synchronize()
                    os.write(wfd, b"c\n")
                    go = read_line(rfd, 2)  # "g", or "e": the judge gave up the window
                    if go == "e\n":
                        return
                    if go != "g\n":
                        raise ValueError(f"unexpected clock message {go[:40]!r}")
                out = call(*sets[i % len(sets)])
                if not _plain(out):  # its work could wait for the copy the judge checks
                    raise RefusedOutput("a timed call returned a tensor subclass "
                                        f"({type(out).__name__}), not a plain tensor")
                put(i, out)
                del out  # one output alive at a time: a GB-sized task's worker holds no more
            synchronize()
            os.write(wfd, b"d\n")
    finally:
        os.close(wfd)
        os.close(rfd)
