"""Parent-clocked timing cross-check (issue 22): the parent's FIFO protocol and its decision."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from verifier import clock
from verifier.clock import ParentClock, calls_for, child_windows, cross_check


def _run_child(workdir: Path, reported_us: float, per_call_s: float) -> list:
    """The worker's side in a thread, in `workdir`, with a call that really takes per_call_s."""
    seen: list[int] = []
    outs: list = []

    def call(k: int) -> int:
        # sleep, not a busy loop: the worker is a thread here, and a loop holding the GIL would
        # delay the parent clock's thread reading the "go" message (a real worker is a process)
        time.sleep(per_call_s)
        return k

    def make(k: int) -> list[int]:
        seen.append(k)
        return [k]

    def target() -> None:
        old = os.getcwd()
        os.chdir(workdir)  # the worker finds the pipes in its working directory
        try:
            outs.extend(child_windows(call, make, lambda: None, reported_us, lambda o: o))
        finally:
            os.chdir(old)

    t = threading.Thread(target=target)
    t.start()
    t.join(timeout=30)
    assert not t.is_alive()
    return [seen, outs]


@pytest.mark.parametrize("reported_us,per_call_s,honest", [
    (2000.0, 0.002, True),     # reports what it takes
    (50.0, 0.002, False),      # reports 40x less than it takes
])
def test_parent_clock_round_trip(tmp_path: Path, reported_us: float, per_call_s: float,
                                 honest: bool) -> None:
    pc = ParentClock(tmp_path)
    try:
        seen, outs = _run_child(tmp_path, reported_us, per_call_s)
    finally:
        windows = pc.stop()
    assert pc.protocol_error == ""
    assert len(windows) == clock.WINDOWS == len(outs)
    n = calls_for(reported_us)
    assert all(w["n"] == n for w in windows)
    # the inputs come from the parent's fresh offsets; each window's last output is from them
    for w, out in zip(windows, outs, strict=True):
        assert w["k"] >= 100_000
        assert out == w["k"] + (n - 1) % min(n, clock.POOL)
    assert len(seen) == clock.WINDOWS * min(n, clock.POOL)
    # the parent's own clock saw at least the time the calls really took
    assert min(w["wall_s"] for w in windows) >= n * per_call_s * 0.9
    ok, why, figures = cross_check(windows, reported_us)
    assert ok is honest, (why, figures)
    if not honest:
        assert "parent's clock measured" in why and figures["reported_us"] == reported_us


def test_cross_check_rules() -> None:
    w = [{"k": 100_000, "n": 10, "reported_us": 100.0, "wall_s": 0.001 + clock.WINDOW_ALLOW_S}
         for _ in range(3)]
    assert cross_check(w, 100.0)[0]
    # load spikes in two windows out of three do not flag an honest candidate (the fastest
    # window counts: a median flagged honest runs on a 2-core host at load 20)
    spiky = [w[0], {**w[1], "wall_s": 5.0}, {**w[2], "wall_s": 0.3}]
    assert cross_check(spiky, 100.0)[0]
    # a report forged by more than K x is slow in every window, so even the fastest fails
    forged = [{**x, "wall_s": x["n"] * (clock.K * 100.0 + clock.CALL_ALLOW_US + 5) * 1e-6
               + clock.WINDOW_ALLOW_S} for x in w]
    ok, why, figures = cross_check(forged, 100.0)
    assert not ok and "fastest of 3 windows" in why and figures["parent_us"] > figures["limit_us"]
    ok, why, _ = cross_check(w, 1.0)  # the result says 1 us, the clock pipe said 100 us
    assert not ok and "not the one reported" in why
    ok, why, _ = cross_check(w[:2], 100.0)
    assert not ok and "2 of 3" in why
    ok, why, _ = cross_check(w, 100.0, protocol_error="unexpected clock message 'x'")
    assert not ok and "unexpected clock message" in why
    assert calls_for(0.0) == clock.MAX_CALLS and calls_for(1e9) == clock.MIN_CALLS


def test_unexpected_message_is_a_protocol_error(tmp_path: Path) -> None:
    pc = ParentClock(tmp_path)
    try:
        fd = os.open(tmp_path / clock.REQ, os.O_WRONLY)
        os.write(fd, b"d\n")  # "done" before any window started
        os.close(fd)
        deadline = time.monotonic() + 5
        while not pc.protocol_error and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        pc.stop()
    assert "unexpected clock message" in pc.protocol_error
    assert not cross_check(pc.windows, 1.0, pc.protocol_error)[0]
