"""Stepped windows: each call's input set exists only once the call before it has written its
output (`verifier.judge.clock`, the cpu judge's windows).

A window that publishes all of its sets at "w" lets the first call compute every set's output
in one batch (one dispatch for the lot) while the later calls answer their rows: every output
right and fresh, and the window times the batch over n calls (tests/verifier/
test_redteam_round6.py). A stepped window publishes set 0 with the fill and each later set
only when the call before it is over:

    judge -> worker "s <n>"     set 0 is in the arena
    worker: call 0, its output into slot 0, "c"
    judge:  slot 0 read now (`WindowJudge.snapshot`), set 1 into the arena, "g"
    ...     call n-1, its output into slot n-1, "d"

So no call can see a later call's inputs: a batch holds one set, and the calls of a window are
n calls. A slot is read the moment its call says it is written, before the next set exists: a
worker that says "c" first and writes its slots later, once it has every set (n round trips,
then one batch), left them empty when they were read; the check fails it as a skipped call.

What the judge times: "s" sent to "d" received, less its own reads of the slots (the worker is
blocked on "g" then, holding no later set: nothing it could do in that time serves a later
call). The write of the next set and the round trip are in the window: a worker that could
watch a set land (a thread of its own, `verifier.judge.clock`'s watcher) would have that
write's time for free were it left out. Every call thus pays one round trip of the clock
pipes and the write of its set. That is measured, not deducted, and paid alike by the
reference, whose baseline is served through the same stepped windows in a candidate-free
child (`verifier.run.runners.SandboxRunner.baseline`): a load spike on a round trip adds time
to a window as it adds to a call, and the runtime stays the fastest window's.

On a GPU the referee's judge publishes a window's sets with one burst of device copies and is a
process away from the clock (`verifier.judge.referee.RemoteJudge`): a round trip to the
referee per call costs far more than a small kernel, so the device windows stay unstepped and
this hole stays open there (tests: benchmarks/redteam_gpu.py --round6, batched_launch). What
would carry it over is the same gate on the device, with no host in the loop: the referee
enqueues on its own stream, per call, `cuStreamWaitValue32` on a flag the worker's harness
writes after its call's copy into the slot (`cuStreamWriteValue32` on the worker's stream), then
the slot's clone and the next set's copy from its staging, then a write of the flag the
harness's stream waits on before the next call: microseconds per call, ordered by the device.
"""

from __future__ import annotations

import os
import time
from typing import Any

STEP, CALL_DONE, GO_ON = "s", "c", "g"  # the messages of a stepped window


def stepped_window(clock: Any, n: int) -> float:
    """A stepped window of n calls (`clock` a `verifier.judge.clock.JudgeClock` whose judge was
    filled stepped): "s" to "d", less the judge's reads of the slots."""
    judge, own = clock.judge, 0.0
    clock.open_window = (time.monotonic(), n)
    t0 = time.perf_counter()
    os.write(clock.wfd, f"{STEP} {n}\n".encode())
    try:
        for k in range(n - 1):
            msg = clock.read_message(t0 + clock.wait_s)
            if msg != CALL_DONE:
                raise ValueError(f"unexpected clock message {msg[:40]!r} after call {k + 1} "
                                 f"of a stepped window of {n}")
            t_in = time.perf_counter()
            judge.snapshot(k)
            own += time.perf_counter() - t_in  # the worker holds no later set meanwhile
            judge.publish(k + 1)
            os.write(clock.wfd, f"{GO_ON}\n".encode())
        msg = clock.read_message(t0 + clock.wait_s)
    finally:
        t1, clock.open_window = time.perf_counter(), None
    if msg != "d":
        raise ValueError(f"unexpected clock message {msg[:40]!r}")
    return t1 - t0 - own


def can_step(judge: Any) -> bool:
    """Whether `judge` publishes sets one at a time: a cpu `WindowJudge` (its arena is a file
    it writes span by span); a device arena's fill writes every set at once."""
    return getattr(judge, "device", "") == "cpu" and hasattr(judge, "publish")
