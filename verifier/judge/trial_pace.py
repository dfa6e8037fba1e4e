"""The judge's clock over the correctness trials: the traced trials are timed by the judge as
its windows are, and a run whose timed windows are much faster per call than its traced trials
is a cheat (issue 28; tests/verifier/test_redteam_round10.py, `blind`).

Every trace of what a call ran lives in the candidate's process (the trials' dispatcher trace,
the timed calls' op recorder, the kernel profile), so a run can tell the timed calls from the
trials (a frame walk finds `serve_windows`), blind the timed calls' recorder and run the
library's op there while its own kernel does the trials: on the persistent worker's loop (the
GPU's) no check outside its process saw it. The judge cannot see what a call ran, but it can
time both kinds of call: on the persistent loop each trial of the judge's arena
(`verifier.run.worker._judged_trials`) runs between the judge's "g" and the worker's "q" on the
clock's pipes, before the windows' "t":

    worker -> judge  "p"     trial t is next
    judge:  trial t's inputs into the trial arena (`TrialJudge.publish`: not there before)
    judge  -> worker "g"     the judge's clock starts
    worker: the traced call, its output into the trial's slot, synchronize
    worker -> judge  "q"     the judge's clock stops
    judge:  trial t's slot read now (`TrialJudge.seal`: what is written later fails the check)

The trials' time per call (the fastest past the first: a first call is cold) is the judge's
figure `trial_us`; `timed_finding` holds it against the windows' `runtime_us`. A traced trial
also pays the dispatcher trace (~70 us a call and ~13 us an aten op on the shared 2-core VM),
its slot copy (the windows' is deducted, `copy_us`) and a pipe round trip, so the rule is
`trial_us > RATIO * runtime_us + ALLOW_US + copy_us` (both figures named in the finding): an
honest kernel is its own trial and window; a run that switches kernels gains at most RATIO (and
ALLOW_US) over its own. A run the rule trips is made again in a fresh worker, and the second
run's verdict stands (`verifier.run.outcome.retimed`): the host's load in the trials is no
cheat. Measured on the shared 2-core VM (persistent cpu loop, trials=5): the conformance
corpus's honest cases (52 strict, 60 partial) at most 0.23 of the bound (median 0.15) at load
2-8; at load 7-31, 50 of 52 at most 0.25 and two trials sets caught by load at 1.31 and 0.86
(0.12 and 0.27 when made again); the round-10 `blind` run over an unoptimised kernel (27-53
ms a call, torch.relu's 2 ms) at 4-6x the bound, the same kernel honest at 0.3-0.4. Over the
cases' compiled ReLU (6 ms a call, torch.relu's 3.9) `blind` stays at 0.87: it gains 1.5x.

The trials are stepped (as stepped windows are, `verifier.judge.stepped`): trial t's inputs
exist in the arena only from its "p" on (the judge publishes them before its "g"; until then
their bytes are the judge's poison), and its slot is sealed at its "q" (a cpu judge reads it
into its own copy then and compares that; a device judge keeps a keyed fingerprint the slot
must still have at the check: `verifier.judge.trial_judge`). So a run cannot compute later
trials' outputs in the uncounted first trial and answer them at once (round 12's `ahead`: its
outputs of the poison are wrong; computing each in its own trial is the blinded run, timed),
nor say "q" first and write the slot after it. The publish is outside the trial's time (a
set's draw is far longer than a small kernel's call: inside, honest trials of a fast kernel
would trip the rule): a thread that watches the arena gains only the time from the set landing
to the "g" (the judge's next write on cpu; the referee's reply on a GPU), not a trial. A paced
job has at least PACED_TRIALS trials (`TrialJudge`: more than the job's `trials` where it asks
fewer, room permitting; they are checked like the others): with `trials=2` one trial was past
the warm-up, no figure, and the rule was off by an operator's option (round 12). Where the
device holds fewer (a task so large that admission fits fewer trials, `verifier.judge.admission`)
the rule is still off: a task's size, not a policy's choice. A run that blinds every trace and
runs the library everywhere is the same in both: that needs a profile outside its process.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from verifier.judge.clock_serve import open_worker_pipes, read_line

PACE, GO, DONE = "p", "g", "q"  # trial t is next / the clock runs / its slot is written
WARM_TRIALS = 1  # trials not counted: a first call is cold (allocations, lazy init, caches)
MIN_TIMED = 2  # trials past the warm-up the rule needs (one trial is one draw of the load)
PACED_TRIALS = WARM_TRIALS + MIN_TIMED  # the fewest trials a paced job has (`TrialJudge`)
RATIO = 3.0  # the trials may be this much slower per call than the windows, plus ALLOW_US
# the dispatcher trace (~0.4 ms a small call), a pipe round trip and two wake-ups (the worker's,
# the judge thread's, which waits for the GIL behind the verifier's other threads): a 2-core
# host at load 30 with a spare worker starting timed honest 0.4 ms trials at 2-16 ms
ALLOW_US = 3000.0
REPORT_MAX = 8 << 20  # a trial report's bytes (plain values, `trial_io.MAX_VALUES` an output)


class WorkerPace:
    """The worker's end: each trial between the judge's "g" and the worker's "q" (no-op where
    the job has no judge's windows: nothing reads the pipes then)."""

    def __init__(self, paced: bool) -> None:
        self.pipes = open_worker_pipes() if paced else None

    @contextmanager
    def trial(self) -> Iterator[None]:
        """One trial, its call and output copy inside (an exception: no "q", the run ends)."""
        if self.pipes is None:
            yield
            return
        wfd, rfd = self.pipes
        os.write(wfd, f"{PACE}\n".encode())
        go = read_line(rfd, 2)
        if go != f"{GO}\n":
            raise ValueError(f"unexpected clock message {go[:40]!r} before a trial")
        yield
        os.write(wfd, f"{DONE}\n".encode())

    def close(self) -> None:
        if self.pipes is not None:
            for fd in self.pipes:
                os.close(fd)
            self.pipes = None


def pace_trials(clock: Any, msg: str) -> str:
    """The judge's end (`verifier.judge.clock.JudgeClock`, its thread): while the worker's
    message `msg` asks for a trial, publish its inputs, say "g", time it to "q" (into
    `clock.trial_s`) and seal its slot (where the job's trial judge is stepped: the window
    judge's `trials`, set by the runner); the first message that is not a trial's, for the
    windows. Publishing and sealing are outside the trial's time (a referee's round trip)."""
    due = clock.trials_due
    trials = getattr(clock.judge, "trials", None)
    trials = trials if getattr(trials, "stepped", False) else None
    while msg == PACE:
        if due is not None and len(clock.trial_s) >= due:  # another thread's: none is fast
            _refuse(clock, f"more paced trials than the job's {due}")
        if trials is not None:  # the trial's inputs exist from now on
            _step(clock, trials.publish, len(clock.trial_s))
        t0 = time.perf_counter()
        os.write(clock.wfd, f"{GO}\n".encode())
        try:
            done = clock.read_message(t0 + clock.wait_s, 2)
        finally:
            t1 = time.perf_counter()
        if done != DONE:
            raise ValueError(f"unexpected clock message {done[:40]!r} in a trial")
        if trials is not None:  # its slot as it is now: what the check holds it to
            _step(clock, trials.seal, len(clock.trial_s))
        clock.trial_s.append(t1 - t0)
        msg = clock.read_message(time.perf_counter() + 1e9)
    ready = msg.partition(" ")[0] == "t"
    if ready and due is not None and len(clock.trial_s) != due:  # the harness paces all
        _refuse(clock, f"{len(clock.trial_s)} paced trials before the windows, the job has {due}")
    return msg


def trials_checked(clock: Any, msg: str) -> bool:
    """At "t": where the worker sent its trials' report with it ("t <bytes>", then the report's
    JSON: `trial_io.ArenaTrials.early`), the job's trial judge (the window judge's `trials`)
    checks the trials now, before any window, and the answer is the trials' (`clock.trials`,
    [ok, why, stats, seconds, the variants checked]: `verifier.run.gpu_runner.GpuRunner.
    _judged_here` reads it, and the verdict records those variants, not the ones the run's end
    names; none is made again as the run ends). False where they failed: no window is served ("e" at once), and
    that failure stands whatever the run does next (`verifier.run.outcome.judged_failure`). A
    wrong candidate (two in five of KernelBench's) then costs no timing at all. A plain "t"
    (no trial judge: a sandboxed run's seeded trials): its trials are checked as it ends."""
    _, _, size = msg.partition(" ")
    if not size:
        return True
    n = int(size) if size.isdigit() else -1
    if not 0 < n <= REPORT_MAX:
        raise ValueError(f"a trial report of {size[:20]!r} bytes")
    data = clock.read_bytes(time.perf_counter() + clock.wait_s, n)
    trials = getattr(clock.judge, "trials", None)
    if trials is None:  # nothing here checks trials (a seeded run's parent compares them)
        return True
    try:
        sent = json.loads(data)
    # the harness sends JSON: the check says what it misses (nested past the parser's depth:
    # RecursionError, a RuntimeError, was the verifier's own failure, `judge_error`)
    except (ValueError, RecursionError):
        sent = None
    sent = sent if isinstance(sent, dict) else {}
    began = time.monotonic()
    try:
        checked = sent.get("variants_checked")
        ok, why, stats = trials.check(sent.get("trial_report"), checked)
    except RuntimeError as exc:  # the referee failed: the verifier's, not the run's
        clock.trials = [None, str(exc), {}, time.monotonic() - began, checked]
        raise
    clock.trials = [ok, why, stats, time.monotonic() - began, checked]
    return bool(ok)


def _step(clock: Any, step: Any, t: int) -> None:
    """The trial judge's `step(t)`; where it fails (the referee, an arena the worker shrank),
    "e" first: the worker's loop ends rather than waits for a "g" that never comes."""
    try:
        step(t)
    except Exception:
        os.write(clock.wfd, b"e\n")
        raise


def _refuse(clock: Any, why: str) -> None:
    """End the exchange ("e": the worker's loop ends rather than waits) and fail the windows."""
    os.write(clock.wfd, b"e\n")
    raise ValueError(why)


def trial_figures(trial_s: list[float]) -> dict[str, Any]:
    """The judge's figures of the paced trials: `trial_us`, the fastest past the warm-up (none
    with fewer than MIN_TIMED of them), and every trial's time."""
    if not trial_s:
        return {}
    warm = trial_s[WARM_TRIALS:]
    figures: dict[str, Any] = {"trials_us": [round(t * 1e6, 2) for t in trial_s]}
    if len(warm) >= MIN_TIMED:
        figures["trial_us"] = round(min(warm) * 1e6, 2)
    return figures


def timed_finding(figures: dict[str, Any]) -> str:
    """Why the judge's windows and trials say the timed calls ran other work than the traced
    trials ("" when they agree, or there is no trial figure)."""
    trial, runtime = figures.get("trial_us"), figures.get("runtime_us")
    allow = ALLOW_US + float(figures.get("copy_us") or 0.0)  # a trial's copy is not deducted
    if not trial or not runtime or trial <= RATIO * runtime + allow:
        return ""
    return (f"the timed calls ran {trial / runtime:.1f}x faster than the traced trials "
            f"(windows {runtime:g} us a call, trials {trial:g} us, both timed by the verifier; "
            f"an honest kernel's trials are within {RATIO:g}x + {allow:g} us): the timed "
            "calls ran other work than the trials")
