"""Red-team round 9b on the cpu backend: the persistent worker's "settle" exchange (`verifier.
run.settle`, `gpu_worker._settle`, `GpuWorkerProcess.settle`) and what a job can leave in the
worker's own loop, the module run as `__main__`.

As in round 9, each attack is left by a model's `__del__` (it runs as the harness drops the
model) or by a finalizer of cyclic garbage (it runs when the worker settles the job, once the
parent has checked its trials). All run as one worker sequence (`chain`): no timing is
asserted, only verdicts, findings and which worker ran a job.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from redteam_round7_cases import NUMPY_RELU  # noqa: E402
from test_redteam_round9 import _jobs, _leaving, _said  # noqa: E402

from verifier.compile import cache_bound  # noqa: E402
from verifier.compile.cache_bound import hold, hold_made  # noqa: E402
from verifier.run import gpu_pool  # noqa: E402

pytestmark = pytest.mark.heavy  # out of the default run: CI runs it (-m heavy)

# the worker's loop runs as `python -m verifier.run.gpu_worker`: its module is `__main__`, not
# `verifier.run.gpu_worker`, and its private functions (`_run_one`, `_settle`) are looked up in
# it at each job; rebound, the next job (an honest sibling's) runs another candidate
MAINER = _leaving("""
import sys
m = sys.modules["__main__"]
run_one = m._run_one
m._run_one = lambda msg, *a: run_one({**msg, "candidate_source": "raise RuntimeError("
                                     "'sabotaged by an earlier job')"}, *a)
""")



def _at_settle(code: str) -> str:
    """An honest numpy ReLU that leaves cyclic garbage whose finalizer runs `code` when the
    worker settles the job (re-armed when a collection in the job itself comes first)."""
    body = "".join(f"        {line}\n" for line in code.strip().splitlines())
    return _leaving("""
import sys
class Later:
    def __del__(self):
        f = sys._getframe()
        while f is not None and f.f_code.co_name != "_settle":
            f = f.f_back
        if f is None:  # collected in the job itself: wait for the settle
            again = Later()
            again.me = again
            return
""" + body + """
first = Later()
first.me = first
""")


# at the settle, on the worker's result socket (its fd is the worker's argv): a settle reply of
# its own and then a result for the next job, ahead of the worker's real reply
INJECTOR = _at_settle("""
import os
os.write(int(sys.argv[1]), b'{"settled": true, "outcome": "ok", "findings": [], '
         b'"worker_leaves": false}\\n{"outcome": "cheat", "error": "framed by an '
         b'earlier job", "findings": [], "stage": "correctness"}\\n')
""")

# the same, knowing the next job's nonce: the finalizer writes the settle reply, then reads the
# next job from the worker's stdin (the parent sends it once it has that reply) and writes the
# job's start line and a failing result with its nonce, as the worker's loop would
NONCE_READER = _at_settle("""
import json, os
fd = int(sys.argv[1])
os.write(fd, b'{"settled": true, "outcome": "ok", "findings": [], "worker_leaves": false}\\n')
nonce = json.loads(sys.stdin.readline())["job"]["nonce"]
os.write(fd, json.dumps({"started": nonce}).encode() + b"\\n" + json.dumps({
    "nonce": nonce, "outcome": "runtime_error", "stage": "correctness", "findings": [],
    "error": "framed by an earlier job"}).encode() + b"\\n")
""")

# the collector's settings: every later job collects at each allocation (slower, its timed
# windows included) and keeps its garbage forever
GC_TUNER = _leaving("""
import gc
gc.set_threshold(1, 1, 1)
gc.set_debug(gc.DEBUG_SAVEALL)
""")
ASK_GC = NUMPY_RELU.replace("        import numpy as np\n", "        import gc\n        raise "
                            "RuntimeError(f'gc={gc.get_threshold()[0]},{gc.get_debug()}')\n")


@pytest.fixture(scope="module")
def chain() -> dict[str, list[dict[str, Any]]]:
    """Every hygiene attack of this file and the honest job after it, in one worker's sequence."""
    runs = {"main": [MAINER, NUMPY_RELU], "gc": [GC_TUNER, ASK_GC]}
    got = _jobs([src for srcs in runs.values() for src in srcs])
    out, i = {}, 0
    for name, srcs in runs.items():
        out[name], i = got[i:i + len(srcs)], i + len(srcs)
    return out


@pytest.fixture(scope="module")
def forged() -> dict[str, list[dict[str, Any]]]:
    """The forgers of the result socket and the honest jobs after them, each run as `GpuRunner`
    runs it (`verifier.run.outcome.confirmed`), in one worker's sequence."""
    runs = {"inject": [NUMPY_RELU, INJECTOR, NUMPY_RELU], "nonce": [NONCE_READER, NUMPY_RELU]}
    got = _jobs([src for srcs in runs.values() for src in srcs], confirm=True)
    out, i = {}, 0
    for name, srcs in runs.items():
        out[name], i = got[i:i + len(srcs)], i + len(srcs)
    return out


def test_the_worker_loops_own_functions_rebound_do_not_reach_the_next_job(
        chain: dict[str, list[dict[str, Any]]]) -> None:
    """A job rebinds `_run_one` of the worker's loop (the module `__main__`: the watched
    harness modules are the `verifier.*` names, and the residue check skips private names) so
    that the next job runs another candidate. Before: the rebinder passed with no finding, and
    the next job, an honest numpy ReLU in the same worker, was a runtime_error ("sabotaged by an
    earlier job"). Now the worker's `__main__` is watched as a harness module: the rebinder is
    the cheat, its worker goes, and the sibling passes."""
    rebinder, honest = chain["main"]
    assert rebinder["outcome"] == "cheat", rebinder
    assert honest["outcome"] == "ok", honest
    assert honest["worker_pid"] != rebinder["worker_pid"]


def test_lines_a_settle_finalizer_writes_are_not_the_next_jobs_result(
        forged: dict[str, list[dict[str, Any]]]) -> None:
    """Cyclic garbage whose finalizer runs at the settle writes, on the worker's result socket
    (any descriptor of the process is the candidate's), a settle reply ("ok", the worker stays)
    and a result ahead of the worker's own reply. Before: the injector passed, and the next
    job, an honest numpy ReLU, got the forged line as its result ("cheat", the same worker).
    Now the parent holds the worker to its protocol (`verifier.run.outcome`): a line after the
    settle reply is tampering (the worker goes; the injector's run, its worker having run an
    earlier job, is made again in a fresh worker, where the line can only be its own: a cheat),
    and a line before the next job's {"started": nonce} voids that run (the worker goes, the job
    is made again in a fresh worker, no verdict charged). Which of the two sees it depends on
    whether the two lines arrive in one read; the honest sibling passes either way."""
    honest0, injector, honest = forged["inject"]
    assert honest0["outcome"] == "ok" and not honest0["confirmed"], honest0
    assert honest["outcome"] == "ok", honest
    assert honest["worker_pid"] != injector["worker_pid"]
    charged = injector["outcome"] == "cheat" and _said(injector, "forged_result")
    voided = "before the job's start" in honest["confirmed"]
    assert charged or voided, (injector, honest)


def test_a_forged_result_with_the_next_jobs_nonce_is_confirmed_in_a_fresh_worker(
        forged: dict[str, list[dict[str, Any]]]) -> None:
    """A finalizer run at the settle writes a settle reply, blocks reading the worker's stdin
    until the parent sends the next job, and so learns its nonce: it writes that job's start
    line and a failing result with the right nonce ("runtime_error", "framed by an earlier
    job"). No line check can tell it from the worker's loop (it shares the process). Before
    the parent held the worker's ready figures (e138203): the forged settle reply stood (the
    reader "ok"), and the sibling's forged failure, its worker having run an earlier job, was
    made again in a fresh worker (`confirmed`), where it passed. Now a settle reply carries the
    figures of the snapshot it compared with (`verifier.run.seal`), which a forger's reply
    lacks: the reader's run is `tampered` (a cheat where it ran first in its worker, as here;
    made again in a fresh worker otherwise), its worker goes before the next job is sent, and
    the sibling passes in a fresh worker, read by no forger."""
    reader, honest = forged["nonce"]
    assert reader["outcome"] == "cheat", reader
    assert any("changed during the run" in m for m in _said(reader, "forged_result")), reader
    assert honest["outcome"] == "ok" and not honest["failure"], honest
    assert honest["worker_pid"] != reader["worker_pid"]


def test_collector_settings_a_job_changes_are_not_handed_to_the_next_job(
        chain: dict[str, list[dict[str, Any]]]) -> None:
    """A job sets the collector to run at every allocation and to keep all garbage
    (`gc.set_threshold(1, 1, 1)`, `DEBUG_SAVEALL`) as its model is dropped. Before: no
    finding, the same worker, and the next job ran with them ("gc=1,32"): every allocation
    of a sibling's timed windows paid a collection, and its garbage was never freed. Now the
    worker compares the collector's settings with when it was ready: changed, it is
    replaced."""
    tuner, ask = chain["gc"]
    assert tuner["outcome"] == "ok", tuner
    assert any("gc." in m for m in _said(tuner, "worker_replaced")), tuner
    assert ask["outcome"] == "runtime_error" and "gc=700,0" in ask.get("error", ""), ask
    assert ask["worker_pid"] != tuner["worker_pid"]


# --- the build cache's hold: a lock any process that can open an entry can take -------------
LOCKER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(120)
"""


def _held_in_thread(entry: Path, find: bool) -> tuple[threading.Thread, list[Any]]:
    got: list[Any] = []

    def body() -> None:
        if find:
            with hold_made(lambda: entry, "ks_pch.h.gch") as held:
                got.append(held)
        else:
            with hold(entry) as there:
                got.append(there)

    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t, got


def test_an_entry_locked_by_another_process_does_not_stall_a_compile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that can open a precompiled header's folder (a job of a persistent worker
    that sees the cache: read-only is enough for flock) takes its exclusive lock and keeps it
    while it lives. Before: every honest compile that uses that header waited in `hold` for
    as long (a thread still waiting after 30 s: the build never started, no timeout applied).
    Now `hold` waits at most HOLD_WAIT_S (set low here) and then says the entry is not there:
    the compile goes on without it (`held_pch` gives None). An entry no one locks is held."""
    monkeypatch.setattr(cache_bound, "HOLD_WAIT_S", 0.5)
    entry = tmp_path / "root" / "pch" / "abc"
    entry.mkdir(parents=True)
    (entry / "ks_pch.h.gch").write_bytes(b"pch")
    t, got = _held_in_thread(entry, find=True)  # nobody else holds it: used
    t.join(30)
    assert not t.is_alive() and got == [entry], got
    locker = subprocess.Popen([sys.executable, "-c", LOCKER, str(entry)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert locker.stdout is not None and locker.stdout.readline().strip() == "locked"
        t, got = _held_in_thread(entry, find=False)
        t.join(30)
        assert not t.is_alive(), "hold still waits for a lock another process keeps"
        assert got == [False]
        t, got = _held_in_thread(entry, find=True)
        t.join(30)
        assert not t.is_alive() and got == [None], got
    finally:
        locker.kill()
        locker.wait()


# at the settle, a sleep past the parent's wait for the reply
SLEEPER = _at_settle("import time\ntime.sleep(20)")


def test_a_finalizer_that_sleeps_through_the_settle_ends_its_worker(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A finalizer run at the settle sleeps past the parent's wait (`SETTLE_S`, 2 s here):
    the job is charged ("did not settle": a warning, its worker replaced), the next job, an
    honest numpy ReLU, runs in a fresh worker and passes."""
    monkeypatch.setattr(gpu_pool, "SETTLE_S", 2.0)
    sleeper, honest = _jobs([SLEEPER, NUMPY_RELU])
    assert sleeper["outcome"] == "ok", sleeper
    assert any("did not settle" in m for m in _said(sleeper, "worker_replaced")), sleeper
    assert honest["outcome"] == "ok", honest
    assert honest["worker_pid"] != sleeper["worker_pid"]


def test_a_result_line_without_end_does_not_grow_the_parents_memory(monkeypatch) -> None:
    """A candidate that writes on the worker's result socket without a newline made the parent
    append every chunk to one buffer (and search it again for a newline: quadratic). Now a
    line past `MAX_LINE_BYTES` ends the worker (as its end of file does), with the buffer
    bounded; a line within it is read as before."""
    import socket
    import threading

    from verifier.run import gpu_pool

    monkeypatch.setattr(gpu_pool, "MAX_LINE_BYTES", 1 << 20)
    ours, theirs = socket.socketpair()
    worker = gpu_pool.GpuWorkerProcess.__new__(gpu_pool.GpuWorkerProcess)
    worker.sock, worker.buf, worker.eof = ours, b"", False
    worker.watch = worker.clock = worker.proc = None
    try:
        theirs.sendall(b'{"outcome": "ok"}\n')
        assert worker._read(10.0) == {"outcome": "ok"}
        def send() -> None:
            try:
                theirs.sendall(b"x" * (8 << 20))
            except OSError:  # the reader stopped reading and closed: the end this test wants
                return

        flood = threading.Thread(target=send, daemon=True)
        flood.start()
        assert worker._read(30.0) is None
        assert worker.eof and len(worker.buf) <= (1 << 20) + (1 << 20)  # one chunk past the bound
    finally:
        ours.close()
        theirs.close()
