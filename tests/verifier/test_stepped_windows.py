"""Stepped windows (`verifier.judge.stepped`): each call's input set is published only once the
call before it has written its slot, so no call can batch a later call's set (red-team round 6,
tests/verifier/test_redteam_round6.py). Calls here are sleeps: what a test asserts does not
depend on the host's load (no ratio of two timings)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from verifier_cases import SCALE_TASK  # noqa: E402

from verifier.judge import clock as clock_mod  # noqa: E402
from verifier.judge.arena import Arena, views  # noqa: E402
from verifier.judge.clock import MIN_CALLS, JudgeClock  # noqa: E402
from verifier.judge.window_judge import WindowJudge  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TOL = (1e-4, 1e-4, 1e-2, 1e-2)
SET_BYTES = 64 * 32 * 4  # SCALE_TASK's one input
CALL_S = 0.002
BATCH_S = 0.005  # the deferrer's batch (a sleep)


def _judge(tmp_path: Path, sets: int = 32) -> WindowJudge:
    return WindowJudge(SCALE_TASK, 0, TOL, 3 * SET_BYTES * sets, path=str(tmp_path / "arena"))


# A worker that speaks the stepped protocol by hand and defers its work: it says "c" at once for
# every call but the last (so the judge publishes every set), then computes all of the window's
# outputs in one batch (one BATCH_S sleep), writes every slot and says "d".
DEFERRER = r'''
import json, os, sys, time
import torch
from verifier.judge.arena import Arena, fill, views
from verifier.judge.clock_serve import open_worker_pipes, read_line
spec = json.loads(sys.argv[1])
arena = Arena.attach(spec["path"], spec["nbytes"], "cpu")
sets = [views(arena, lay) for lay in spec["sets"]]
slots = [views(arena, lay) for lay in spec["outs"]]
torch.stack([s[0] for s in sets]) * 3.0 + 1.0  # warm, as a worker after its trials
wfd, rfd = open_worker_pipes()
os.write(wfd, b"t\n")
while (msg := read_line(rfd).split()) != ["e"]:
    n = int(msg[1])
    for _ in range(n - 1 if msg[0] == "s" else 0):  # "c" at once: the judge publishes on
        os.write(wfd, b"c\n")
        assert read_line(rfd) == "g\n"
    if n:  # (a window of no calls: the round trip)
        if msg[0] == "s":  # the batch's cost (a window of one call: it answers at once)
            time.sleep(float(sys.argv[2]))
        rows = (torch.stack([s[0] for s in sets[:n]]) * 3.0 + 1.0).unbind(0)
        for i in range(n):
            fill(slots[i], rows[i])
    os.write(wfd, b"d\n")
sys.stdout.flush()
os._exit(0)
'''


def _run(tmp_path: Path, script: str, stepped: bool = True, sets: int = 32,
         call_s: float = CALL_S) -> dict[str, Any]:
    """The judge's windows (stepped or not) served by `script` in a worker process (`call_s`
    its argv[2]: what a call, or a batch, sleeps)."""
    judge = _judge(tmp_path, sets)
    jc = JudgeClock(judge, workdir=tmp_path, wait_s=30.0, stepped=stepped)
    spec = {**judge.spec, "path": str(tmp_path / "arena")}
    try:
        proc = subprocess.run([sys.executable, "-c", script, json.dumps(spec), str(call_s)],
                              cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                              timeout=120, capture_output=True, text=True)
        res = jc.result()
    finally:
        judge.close()
    res["returncode"], res["stderr"] = proc.returncode, proc.stderr[-2000:]
    return res


def test_a_worker_that_says_done_before_its_call_and_batches_later_is_caught(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Defence off (the slots read only after "d", as an unstepped window's): the deferrer's n
    round trips and one batch pass, at a fraction of a call per call. On: each slot is read as
    its call says it is written; the deferred ones were empty then: a cheat."""
    _long_windows(monkeypatch)
    (tmp_path / "off").mkdir()
    with monkeypatch.context() as patch:  # the slots read only at the check, after "d"
        patch.setattr(WindowJudge, "snapshot", lambda self, k: None)
        off = _run(tmp_path / "off", DEFERRER, call_s=BATCH_S)
    # windows of MIN_CALLS calls or more, each one batch (the deferrer's construction), passed
    # the judge's checks: a call's share of the window is a batch's over n (no timing asserted:
    # a loaded host shrinks n and blurs it, never the mechanism)
    assert off["failure"] == "" and off["figures"]["calls"] >= MIN_CALLS, off
    (tmp_path / "on").mkdir()
    on = _run(tmp_path / "on", DEFERRER, call_s=BATCH_S)
    assert "the output of a timed call was wrong" in on["failure"], on
    assert on["figures"] == {}


def _long_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows of 0.2 s: a one-call window a loaded host stretches past the usual 20 ms target
    would leave the runtime to windows of one call, which are never stepped."""
    monkeypatch.setattr(clock_mod, "TARGET_S", 0.2)


HONEST = r'''
import json, os, sys, time
from verifier.judge.arena import Arena, fill, views
from verifier.judge.clock_serve import open_worker_pipes, serve_windows
spec = json.loads(sys.argv[1])
arena = Arena.attach(spec["path"], spec["nbytes"], "cpu")
sets = [views(arena, lay) for lay in spec["sets"]]
slots = [views(arena, lay) for lay in spec["outs"]]


def forward(x):
    time.sleep(float(sys.argv[2]))
    return x * 3.0 + 1.0


serve_windows(open_worker_pipes(), forward, sets, lambda i, out: fill(slots[i], out),
              lambda: None)
sys.stdout.flush()
os._exit(0)
'''


def test_an_honest_worker_process_serves_stepped_windows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The harness's own loop (`serve_windows`) in a worker process answers stepped windows:
    every window of more than one call was stepped, every checked output right, and the
    runtime is a call's (a sleep at least: load only adds)."""
    steps: list[int] = []
    real = clock_mod.stepped_window

    def counting(clock: Any, n: int) -> float:
        steps.append(n)
        return real(clock, n)

    monkeypatch.setattr(clock_mod, "stepped_window", counting)
    res = _run(tmp_path, HONEST, sets=16)
    assert res["returncode"] == 0, res["stderr"]
    assert res["failure"] == "" and res["judge_error"] == "", res
    assert res["figures"]["runtime_us"] >= 0.95 * CALL_S * 1e6, res["figures"]
    assert steps and max(steps) == res["figures"]["calls"] > 1, (steps, res["figures"])


def test_a_device_judge_is_never_stepped(tmp_path: Path) -> None:
    """A judge whose fill writes every set at once (a device arena, the referee's) gets
    unstepped windows: `stepped` asks, the judge decides."""
    judge = _judge(tmp_path)
    judge.device = "cuda"  # as the referee's: no span-by-span publish of its arena
    jc = JudgeClock(judge, workdir=tmp_path, wait_s=1.0, stepped=True)
    try:
        assert jc.stepped is False and judge.stepped is False
    finally:
        jc.stop()
        judge.device = "cpu"
        judge.close()


def test_a_stepped_fill_publishes_the_first_set_only(tmp_path: Path) -> None:
    """The arena holds a window's first set after the fill, each later one only once
    `publish` wrote it (what the worker maps is the file)."""
    judge = _judge(tmp_path, sets=4)
    judge.stepped = True
    arena = Arena.attach(str(tmp_path / "arena"), judge.spec["nbytes"], "cpu")
    try:
        seen = [views(arena, lay) for lay in judge.spec["sets"]]
        judge.fill(4)
        drawn = judge.pristine
        assert torch.equal(seen[0][0], drawn[0][0])
        assert not any(torch.equal(seen[k][0], drawn[k][0]) for k in (1, 2, 3))
        judge.publish(1)
        assert torch.equal(seen[1][0], drawn[1][0])
        assert not torch.equal(seen[2][0], drawn[2][0])
    finally:
        arena.close()
        judge.close()


def test_the_step_floor_is_a_trusted_round_trip_and_the_sets_write(tmp_path: Path) -> None:
    """What a stepped window deducts per step: a spinning echo's round trip (the same for every
    size) plus the judge's write of a set, the latter only where the write stays in the
    window; a metered clock (cpu time beyond its cores charged) leaves it out."""
    from verifier.judge.stepped import step_floor_s

    echo, big = step_floor_s(0), step_floor_s(1 << 20)
    assert 0 < echo < big < 0.05, (echo, big)
    assert step_floor_s(0) == echo  # measured once: the fastest this process saw
    judge = _judge(tmp_path)
    jc = JudgeClock(judge, workdir=tmp_path, wait_s=1.0, stepped=True)
    try:
        assert jc.step_s >= step_floor_s(judge.set_bytes) > echo  # (fastest: only lower)
        jc.watch(lambda: 0.0, cpus=1)
        assert jc.step_s == echo
        # a window's deduction: its n-1 steps and n copies, at most half of it
        want = (1.0 - min(4 * judge.copy_s + 3 * echo, 0.5)) / 4
        assert jc.call_time(1.0, 4) == pytest.approx(want, rel=1e-12)
    finally:
        jc.stop()
        judge.close()


# A worker with a thread that watches the arena's sets: each set whose first value changed has
# landed; it computes that set's output (BUSY_S of cpu) into its slot at once. The main thread
# speaks the stepped protocol and only waits for the watcher's outputs: with the judge's write
# of the next set left out of the window, the watcher's work during that write is free unless
# the run's cpu time beyond its one core is charged.
WATCHER = r'''
import json, os, sys, threading, time
from verifier.judge.arena import Arena, fill, views
from verifier.judge.clock_serve import open_worker_pipes, read_line
spec, busy = json.loads(sys.argv[1]), float(sys.argv[2])
arena = Arena.attach(spec["path"], spec["nbytes"], "cpu")
sets = [views(arena, lay) for lay in spec["sets"]]
slots = [views(arena, lay) for lay in spec["outs"]]
seen = [float(s[0][0, 0]) for s in sets]
done = set()


def watch():
    while True:
        for i, s in enumerate(sets):
            v = float(s[0][0, 0])
            if v != seen[i]:
                t = time.thread_time()  # the work: `busy` of cpu, however loaded
                while time.thread_time() - t < busy:
                    pass
                fill(slots[i], s[0] * 3.0 + 1.0)
                seen[i] = v
                done.add(i)
        time.sleep(0.0001)


threading.Thread(target=watch, daemon=True).start()
wfd, rfd = open_worker_pipes()
os.write(wfd, b"t\n")
while (msg := read_line(rfd).split()) != ["e"]:
    n = int(msg[1])
    for i in range(n):
        if i:
            os.write(wfd, b"c\n")
            assert read_line(rfd) == "g\n"
        while i not in done:
            time.sleep(0.0001)
        done.discard(i)
    os.write(wfd, b"d\n")
sys.stdout.flush()
os._exit(0)
'''


class _SlowPublish(WindowJudge):
    """A judge whose write of a set takes PUBLISH_S (as a large set's does): time a watcher
    could compute in."""

    def publish(self, k: int) -> None:
        super().publish(k)
        time.sleep(PUBLISH_S)


PUBLISH_S = 0.03  # the watcher's BATCH_S of cpu fits in it on a loaded host too


def _watched(tmp_path: Path, cpus: int | None) -> tuple[dict[str, Any], JudgeClock]:
    """The WATCHER worker's stepped windows, its cpu time metered (`cpus`: its cores)."""
    from test_clock_rogues import threads_cpu_s, threads_runnable

    judge = _SlowPublish(SCALE_TASK, 0, TOL, 3 * SET_BYTES * 16, path=str(tmp_path / "arena"))
    jc = JudgeClock(judge, workdir=tmp_path, wait_s=30.0, stepped=True)
    spec = {**judge.spec, "path": str(tmp_path / "arena")}
    proc = subprocess.Popen([sys.executable, "-c", WATCHER, json.dumps(spec), str(BATCH_S)],
                            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        jc.watch(lambda: threads_cpu_s(proc.pid), cpus=cpus,
                 runnable=threads_runnable(proc.pid))
        proc.wait(timeout=120)
        res = jc.result()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        judge.close()
    assert proc.returncode == 0 and res["failure"] == "", res
    assert res["figures"]["calls"] > 1 and jc.stepped, res  # stepped windows set the runtime
    return res, jc


def test_a_watcher_computing_while_a_step_writes_its_set_is_charged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The judge leaves its write of the next set out of a stepped window only where the run's
    cpu time beyond its cores is charged. Off (the write left out, nothing charged): the
    watcher's BATCH_S of cpu per set, done while the judge wrote it, is free. On: it is charged
    to the window (the runtime is a call's at least, however loaded: cpu seconds are at least
    the wall seconds the work would have taken)."""
    from verifier.judge import stepped

    _long_windows(monkeypatch)
    (tmp_path / "off").mkdir()
    with monkeypatch.context() as patch:
        patch.setattr(stepped, "metered", lambda clock: True)
        off, _ = _watched(tmp_path / "off", cpus=None)
    assert off["figures"]["runtime_us"] < 0.75 * BATCH_S * 1e6, off["figures"]
    (tmp_path / "on").mkdir()
    on, _ = _watched(tmp_path / "on", cpus=1)
    assert on["figures"]["runtime_us"] >= 0.75 * BATCH_S * 1e6, on["figures"]
