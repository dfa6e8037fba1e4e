"""Parent-clocked timing cross-check: the runtime a worker reports is checked against wall time
measured by the verifier process's own clock, which code in the worker cannot reach.

The worker's timing (host clock or GPU events, `Backend.time_call`) runs in the candidate's
process, so a candidate can scale what it reports (patch `time_call`, `summarize`, the C function
behind `time.perf_counter`). After its own timing the worker runs `WINDOWS` parent-clocked
windows through two FIFOs the parent made in the run directory:

    worker -> parent  "r <reported us>"      parent -> worker  "<seed offset k> <calls n>"
    worker: makes up to `POOL` input sets from input_seed + k (fresh, unknown before), then
    worker -> parent  "g"                    worker: n calls, synchronize
    worker -> parent  "d"

The parent times "g" to "d" with its own clock and checks the output of each window's last call
against its own reference (cpu), so the calls cannot be skipped. The number of calls is chosen
from the reported time (about `TARGET_S` of work if the report is true), so a forged report
makes the window long. A candidate is a `cheat` when even the fastest window's time per call,
by the parent's clock, exceeds `K` x the reported time + `CALL_ALLOW_US` (after
`WINDOW_ALLOW_S` of wake-up and pipe latency per window). Load on the host only ever adds
time to a window, and a window cannot run faster than the calls truly take (each window's last
output is checked), so the fastest window is the truest figure: an honest candidate passes when
one window ran undisturbed (the median failed honest runs on a 2-core host at load 20), and a
report forged by more than `K` x fails every window.
"""

from __future__ import annotations

import math
import os
import secrets
import select
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REQ, GO = "clock.req", "clock.go"
FDS_ENV = "KS_CLOCK_FDS"  # a persistent worker's inherited pipe ends: "<req write>,<go read>"
WINDOWS, POOL = 3, 4
TARGET_S, MIN_CALLS, MAX_CALLS = 0.02, 3, 50  # a forged report costs <= 3 x 50 calls
K, CALL_ALLOW_US, WINDOW_ALLOW_S = 8.0, 50.0, 0.005
_SEED_BASE = 100_000  # above the worker's trial (1000 + t) and timing (5000 + i) offsets


def calls_for(reported_us: float) -> int:
    """Calls in one window: about TARGET_S of work at the reported time."""
    if not reported_us or reported_us <= 0 or not math.isfinite(reported_us):
        return MAX_CALLS
    return max(MIN_CALLS, min(MAX_CALLS, math.ceil(TARGET_S * 1e6 / reported_us)))


# --- worker side (runs in the candidate's process: nothing here is believed) -----------------
def _readline(fd: int) -> str:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = os.read(fd, 1)
        if not chunk:
            raise OSError("the verifier's clock pipe closed")
        buf += chunk
    return buf.decode()


def child_windows(call: Callable[..., Any], make_inputs: Callable[[int], list[Any]],
                  synchronize: Callable[[], None], reported_us: float,
                  keep: Callable[[Any], Any]) -> list[Any] | None:
    """Run the parent-clocked windows (None where the parent made no clock pipes): FIFOs in the
    run directory (a sandboxed run), or pipes a persistent worker inherited (FDS_ENV)."""
    fds = os.environ.get(FDS_ENV, "")
    if fds:
        wfd, rfd = (os.dup(int(f)) for f in fds.split(","))
    elif os.path.exists(REQ):
        wfd, rfd = os.open(REQ, os.O_WRONLY), os.open(GO, os.O_RDONLY)
    else:
        return None
    outputs = []
    try:
        for _ in range(WINDOWS):
            os.write(wfd, f"r {reported_us!r}\n".encode())
            k, n = (int(v) for v in _readline(rfd).split())
            sets = [make_inputs(k + j) for j in range(min(n, POOL))]
            synchronize()
            os.write(wfd, b"g\n")
            for i in range(n):
                out = call(*sets[i % len(sets)])
            synchronize()
            os.write(wfd, b"d\n")
            outputs.append(keep(out))
    finally:
        os.close(wfd)
        os.close(rfd)
    return outputs


# --- parent side -------------------------------------------------------------------------------
class ParentClock:
    """The parent's end of the clock pipes for one run directory; a thread answers the worker."""

    def __init__(self, workdir: Path | None, fds: tuple[int, int] | None = None) -> None:
        """FIFOs made in `workdir`, or `fds` (read, write): a persistent worker's pipes, kept
        open across jobs (what an earlier job left in them is drained first)."""
        self.windows: list[dict[str, Any]] = []
        self.protocol_error = ""
        self.own = fds is None
        if fds is None:
            assert workdir is not None
            os.mkfifo(workdir / REQ, 0o600)
            os.mkfifo(workdir / GO, 0o600)
            # O_RDWR: opening never blocks, reads never see EOF while a worker comes and goes
            self.rfd = os.open(workdir / REQ, os.O_RDWR | os.O_NONBLOCK)
            self.wfd = os.open(workdir / GO, os.O_RDWR | os.O_NONBLOCK)
        else:
            self.rfd, self.wfd = fds
            try:
                while os.read(self.rfd, 1 << 16):
                    pass
            except BlockingIOError:
                pass
        self._stop = threading.Event()
        self._cur: dict[str, Any] | None = None
        self._thread = threading.Thread(target=self._loop, name="ks-parent-clock", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        buf = b""
        while not self._stop.is_set():
            ready, _, _ = select.select([self.rfd], [], [], 0.1)
            if not ready:
                continue
            t = time.perf_counter()  # the parent's clock, at the moment the message arrived
            try:
                buf += os.read(self.rfd, 4096)
            except BlockingIOError:
                continue
            while b"\n" in buf and not self.protocol_error:
                line, buf = buf.split(b"\n", 1)
                self._on(line.decode(errors="replace").split(), t)
            if len(buf) > 4096 or self.protocol_error:
                self.protocol_error = self.protocol_error or "oversized clock message"
                return

    def _on(self, msg: list[str], t: float) -> None:
        cur = self._cur
        if msg and msg[0] == "r" and len(msg) == 2 and cur is None and len(self.windows) < WINDOWS:
            try:
                reported = float(msg[1])
            except ValueError:
                self.protocol_error = f"bad clock message {' '.join(msg)[:40]!r}"
                return
            k, n = _SEED_BASE + secrets.randbelow(1 << 24), calls_for(reported)
            self._cur = {"k": k, "n": n, "reported_us": reported, "t0": time.perf_counter()}
            os.write(self.wfd, f"{k} {n}\n".encode())
        elif msg == ["g"] and cur is not None and "t_g" not in cur:
            cur["t_g"], cur["prep_s"] = t, t - cur["t0"]
        elif msg == ["d"] and cur is not None and "t_g" in cur:
            cur["wall_s"] = t - cur.pop("t_g")
            cur.pop("t0")
            self.windows.append(cur)
            self._cur = None
        else:
            self.protocol_error = f"unexpected clock message {' '.join(msg)[:40]!r}"

    def stop(self) -> list[dict[str, Any]]:
        self._stop.set()
        self._thread.join(timeout=2.0)
        if self.own:
            os.close(self.rfd)
            os.close(self.wfd)
        return self.windows


def cross_check(windows: list[dict[str, Any]], reported_us: float | None,
                protocol_error: str = "") -> tuple[bool, str, dict[str, Any]]:
    """(ok, why not, figures): the parent's wall time per call against the reported time."""
    if protocol_error:
        return False, f"the parent-clocked timing failed: {protocol_error}", {}
    if len(windows) < WINDOWS:
        return False, (f"the worker ran {len(windows)} of {WINDOWS} parent-clocked timing "
                       "windows"), {}
    if reported_us is None or any(w["reported_us"] != reported_us for w in windows):
        return False, ("the runtime announced on the clock pipe "
                       f"({windows[0]['reported_us']} us) is not the one reported "
                       f"({reported_us} us)"), {}
    # the fastest window: load adds time, nothing in the worker can take it away
    parent_us = min(max(0.0, w["wall_s"] - WINDOW_ALLOW_S) / w["n"] * 1e6 for w in windows)
    limit = K * reported_us + CALL_ALLOW_US
    figures = {"parent_us": round(parent_us, 2), "reported_us": round(reported_us, 2),
               "limit_us": round(limit, 2), "calls": [w["n"] for w in windows],
               "window_ms": [round(w["wall_s"] * 1e3, 3) for w in windows]}
    if parent_us <= limit:
        return True, "", figures
    return False, (f"the parent's clock measured {parent_us:.1f} us per call (fastest of "
                   f"{len(windows)} windows of {windows[0]['n']} calls), the worker reported "
                   f"{reported_us:.1f} us (limit {limit:.1f} us = {K:g} x reported + "
                   f"{CALL_ALLOW_US:g} us)"), figures


def check_outputs(task_source: str, seed: int, input_seed: int, windows: list[dict[str, Any]],
                  outputs: list[Any] | None, tol: tuple[float, float, float, float]
                  ) -> tuple[bool, str]:
    """(ok, why not): each window's last output against the parent's reference (cpu runs)."""
    import torch

    from verifier.decide import _LOCK, _reference, make_inputs, on_device
    from verifier.judge import _judge

    if outputs is None or len(outputs) != len(windows):
        return False, "the worker left no outputs of its parent-clocked timing windows"
    model, get_inputs = _reference(task_source, seed)
    with _LOCK, torch.no_grad():
        for w, out in zip(windows, outputs, strict=True):
            inputs = make_inputs(get_inputs,
                                 input_seed + w["k"] + (w["n"] - 1) % min(w["n"], POOL))
            ref_out = model(*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])
            verdict, msg, _, _ = _judge(model, inputs, ref_out, on_device(out), tol)
            if verdict != "ok":
                return False, f"a parent-clocked timing call's output was wrong: {msg}"
    return True, ""
