"""The judge's clock: a candidate's runtime is measured by the trusted judge, never reported.

Code that shares a process with the candidate is the candidate's, so the worker reports no
time at all. After its correctness trials it serves timed windows over two pipes (FIFOs in the
run directory of a sandboxed run; inherited pipes, `FDS_ENV`, of a persistent worker):

    worker -> judge  "t"        ready: its inputs are views of the judge's arena (`verifier.arena`)
    judge  -> worker "w <n>"    sent right after the judge wrote fresh inputs into the arena
    worker: n calls over the arena's input sets (under the dispatcher trace, as every call),
            the last call's output copied into the arena's slot, synchronize
    worker -> judge  "d"
    judge  -> worker "e"        no more windows

The judge times "w" sent to "d" received with its own clock. The worker cannot compute ahead:
a window's inputs do not exist before the judge writes them, right before "w". It cannot skip
calls unseen: the last output is checked against the judge's reference and every input
against the judge's pristine copy; a window has no more calls than input sets (a repeated set
would let a cache answer without the work), and a timed call's output is a plain tensor (a lazy
subclass would do the work only for the one output copied into the slot). A window with no
calls measures the round trip; a window of one call the call; then `WINDOWS` windows of n
calls, n large enough that the round trip is under 1% of a window (and a window at least
`TARGET_S`), but never more than the judge's input sets (where they are too few, the round
trip's larger share only adds time). The runtime is the fastest window's
time per call, less the judge's own time for the one output copy: load only adds time, and no
window runs faster than its calls truly take. The reference's baseline is timed the same way
(`time_windows`) in a process that never ran candidate code.
"""

from __future__ import annotations

import math
import os
import select
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REQ, GO = "clock.req", "clock.go"
FDS_ENV = "KS_CLOCK_FDS"  # a persistent worker's inherited pipe ends: "<req write>,<go read>"
WINDOWS = 5
TARGET_S = 0.02  # a window is at least this long (timer and scheduler noise well under 1%)
ROUND_TRIP_SHARE = 0.01  # the round trip is under this share of a window
MIN_CALLS, MAX_CALLS = 3, 100_000
WAIT_S = 120.0  # the longest the judge waits for one message


def calls_for(call_s: float, round_trip_s: float = 0.0) -> int:
    """Calls in one window: at least TARGET_S of work, the round trip under 1% of it."""
    want = max(TARGET_S, round_trip_s / ROUND_TRIP_SHARE)
    if not call_s > 0 or not math.isfinite(call_s):
        return MIN_CALLS
    return max(MIN_CALLS, min(MAX_CALLS, math.ceil(want / call_s)))


def summarize(per_call_s: list[float]) -> dict[str, Any]:
    """Runtime figures (us) of windows' times per call: the fastest, and the spread."""
    xs = sorted(per_call_s)
    q1, q3 = xs[len(xs) // 4], xs[(3 * len(xs)) // 4]
    return {"runtime_us": round(xs[0] * 1e6, 4), "median_us": round(xs[len(xs) // 2] * 1e6, 4),
            "iqr_us": round((q3 - q1) * 1e6, 4), "windows_us": [round(x * 1e6, 4) for x in xs]}


def time_windows(call: Callable[..., Any], sets: list[list[Any]], refresh: Callable[[], None],
                 synchronize: Callable[[], None], keep: Callable[[Any], None]
                 ) -> dict[str, Any]:
    """The same windows timed in this (trusted) process: the reference's eager or compiled
    baseline. `refresh` draws fresh inputs into `sets` (outside the clock), `keep` copies the
    last output once (as the worker copies its output into the slot)."""
    def window(n: int) -> float:
        refresh()
        synchronize()
        t0 = time.perf_counter()
        out = None
        for i in range(n):
            out = call(*sets[i % len(sets)])
        if n:
            keep(out)
        synchronize()
        return time.perf_counter() - t0

    window(1)  # warm-up: first-call costs (allocations, lazy init) are not the call's
    n = calls_for(min(window(1) for _ in range(2)))
    figures = summarize([window(n) / n for _ in range(WINDOWS)])
    figures["calls"] = n
    return figures


# --- worker side (runs in the candidate's process: it only serves, it reports nothing) -------
def _readline(fd: int) -> str:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = os.read(fd, 1)
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


def serve_windows(pipes: tuple[int, int], call: Callable[..., Any], sets: list[list[Any]],
                  put: Callable[[Any], None], synchronize: Callable[[], None]) -> None:
    """Serve the judge's windows until it says "e": n calls over `sets`, `put` the last
    output into the slot, synchronize, "d"."""
    wfd, rfd = pipes
    try:
        os.write(wfd, b"t\n")
        while True:
            msg = _readline(rfd).split()
            if msg == ["e"]:
                return
            n = int(msg[1])
            out = None
            for i in range(n):
                out = call(*sets[i % len(sets)])
            if n:
                if not _plain(out):  # its work could wait for the one copy the judge checks
                    raise RefusedOutput("a timed call returned a tensor subclass "
                                        f"({type(out).__name__}), not a plain tensor")
                put(out)
            synchronize()
            os.write(wfd, b"d\n")
    finally:
        os.close(wfd)
        os.close(rfd)


# --- judge side ---------------------------------------------------------------------------
class JudgeClock:
    """The judge's end of the clock pipes for one run; a thread drives the windows.

    `judge` writes fresh inputs (`fill()`), checks a window's output slot and inputs
    (`check(n) -> why not or ""`), and knows its own time for one output copy (`copy_s`)."""

    def __init__(self, judge: Any, workdir: Path | None = None,
                 fds: tuple[int, int] | None = None, wait_s: float = WAIT_S) -> None:
        """FIFOs made in `workdir`, or `fds` (read, write): a persistent worker's pipes, kept
        open across jobs (what an earlier job left in them is drained first)."""
        self.judge, self.wait_s = judge, wait_s
        self.figures: dict[str, Any] = {}
        self.failure = ""  # why the windows do not stand (the worker's doing)
        self.judge_error = ""  # why the judge could not time them (not the worker's doing)
        self.own = fds is None
        if fds is None:
            assert workdir is not None
            os.mkfifo(workdir / REQ, 0o666)
            os.mkfifo(workdir / GO, 0o666)
            # O_RDWR: opening never blocks, reads never see EOF while a worker comes and goes
            self.rfd = os.open(workdir / REQ, os.O_RDWR | os.O_NONBLOCK)
            self.wfd = os.open(workdir / GO, os.O_RDWR | os.O_NONBLOCK)
        else:
            self.rfd, self.wfd = fds
            _drain(self.rfd)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drive, name="ks-judge-clock", daemon=True)
        self._thread.start()

    def _read(self, deadline: float) -> str:
        """The worker's next message (one byte at a time: nothing of a later one is lost)."""
        buf = b""
        while not buf.endswith(b"\n"):
            left = deadline - time.perf_counter()
            if self._stop.is_set() or left <= 0:
                raise TimeoutError("no message from the worker")
            if not select.select([self.rfd], [], [], min(left, 0.1))[0]:
                continue
            try:
                chunk = os.read(self.rfd, 1)
            except BlockingIOError:
                continue
            if not chunk:
                raise OSError("the worker closed the clock pipe")
            buf += chunk
            if len(buf) > 64:
                raise ValueError("an oversized clock message")
        return buf.decode(errors="replace").strip()

    def _window(self, n: int) -> float:
        # the clock starts before the order leaves: a judge thread that waits for the GIL
        # after its write would start it after the worker's window (an honest 64 KB ReLU
        # timed 0.2 us on the persistent path)
        t0 = time.perf_counter()
        os.write(self.wfd, f"w {n}\n".encode())
        msg = self._read(t0 + self.wait_s)
        t1 = time.perf_counter()
        if msg != "d":
            raise ValueError(f"unexpected clock message {msg[:40]!r}")
        return t1 - t0

    def _drive(self) -> None:
        started = False
        try:
            msg = self._read(time.perf_counter() + 1e9)  # a run that fails first sends nothing
            if msg != "t":
                raise ValueError(f"unexpected clock message {msg[:40]!r}")
            started = True
            self.figures = self._measure()
        except TimeoutError:
            if not self._stop.is_set():
                self.failure = "the worker did not finish a timing window in time"
        except (OSError, ValueError) as exc:
            self.failure = f"the timing windows failed: {exc}"
        except RuntimeError as exc:  # the judge itself (the referee) failed: not the worker
            self.judge_error = f"the verifier's timing judge failed: {exc}"
        finally:
            if started:  # the worker waits for its next order only once it said "t"
                try:
                    os.write(self.wfd, b"e\n")
                except OSError as exc:
                    self.failure = self.failure or f"the timing windows failed: {exc}"

    def _measure(self) -> dict[str, Any]:
        round_trip = min(self._window(0) for _ in range(3))
        self.judge.fill()
        one = self._window(1)
        why = self.judge.check(1)
        if why:
            self.failure = why
            return {}
        copy_s = self.judge.copy_s
        # no more calls than input sets: every call of a window on a set fresh for it (the
        # round trip's share grows past 1% only where the judge's budget holds too few sets,
        # and it only adds time)
        n = min(calls_for(max(one - round_trip - copy_s, 1e-7), round_trip), self.judge.sets)
        per_call = []
        for _ in range(WINDOWS):
            self.judge.fill()
            wall = self._window(n)
            why = self.judge.check(n)
            if why:
                self.failure = why
                return {}
            # the copy was measured once, when the judge was made: a load spike then must not
            # take a window's work away (a call writes its output: the copy is at most half)
            per_call.append((wall - min(copy_s, wall / 2)) / n)
        figures = summarize(per_call)
        figures.update(calls=n, round_trip_us=round(round_trip * 1e6, 2),
                       copy_us=round(copy_s * 1e6, 2), sets=self.judge.sets,
                       out_bytes=int(self.judge.out_bytes))
        return figures

    def result(self) -> dict[str, Any]:
        """What the judge measured once the windows are over: {"figures", "failure" (the
        worker's doing), "judge_error" (the verifier's)}."""
        figures = self.stop()
        return {"figures": figures, "failure": self.failure, "judge_error": self.judge_error}

    def stop(self) -> dict[str, Any]:
        """The figures once the windows are over (or abandoned: the worker is gone)."""
        self._stop.set()
        self._thread.join(timeout=5.0)
        if self.own:
            os.close(self.rfd)
            os.close(self.wfd)
        return self.figures


NO_JUDGE = "the verifier has no timing judge on this backend"


def no_judge() -> dict[str, Any]:
    """The result of a run no judge timed (a backend whose device the judge cannot map)."""
    return {"figures": {}, "failure": "", "judge_error": NO_JUDGE}


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 1 << 16):
            pass
    except BlockingIOError:
        pass


def time_reference(ref: Any, make_inputs: Callable[[int], list[Any]],
                   synchronize: Callable[[], None], torch_compile: bool = False,
                   pool: int = 4) -> dict[str, Any]:
    """Eager (and torch.compile) baselines of the reference module `ref`, timed in windows as
    the judge times candidates; only a process that never ran candidate code calls this."""
    import torch

    from verifier.arena import fill

    draws = [10_000]
    sets = [make_inputs(draws[0] + i) for i in range(pool)]

    def refresh() -> None:  # fresh inputs for every window, drawn outside the clock
        draws[0] += pool
        sets[:] = [make_inputs(draws[0] + i) for i in range(pool)]

    with torch.no_grad():
        first = ref(*sets[0])
        scratch = (first.clone() if isinstance(first, torch.Tensor)
                   else type(first)(x.clone() if isinstance(x, torch.Tensor) else x
                                    for x in first))
        keep = lambda out: fill(scratch, out)  # noqa: E731 - the output copied once
        eager = time_windows(ref, sets, refresh, synchronize, keep)
        figures = {"eager_us": eager["runtime_us"], "eager_iqr_us": eager["iqr_us"],
                   "eager_windows": eager}
        if torch_compile:
            compiled = time_windows(torch.compile(ref), sets, refresh, synchronize, keep)
            figures.update(compiled_us=compiled["runtime_us"], compiled_windows=compiled)
    return figures
