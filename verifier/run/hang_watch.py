"""A persistent worker's hang deadlines (`verifier.judge.pace`): the job in flight must reach its
next step by a deadline scaled to the reference's own time, not by the flat run timeout.

Steps, as the worker reports them (`verifier.run.worker`: progress and step lines) and as the
judge's clock runs its windows (`verifier.judge.clock.JudgeClock.open_window`):
- from the job to "correctness": the reference loads (no candidate code yet): the run timeout;
  that time is the measure of the candidate's load;
- "correctness" to the first "trial": the candidate loads: `HANG_FLOOR_S` + `LOAD_FACTOR` x it;
- each "trial", "kernels" (the kernel profile) and "performance" (up to the clock's first
  window): one call, `Pace.step_s(1)`; the first of them `FIRST_CALL_S` more (a first call's
  lazy loads: the kernel's module, cuBLAS/cuDNN handles), `JIT_FIRST_CALL_S` where the
  candidate may compile then (`pace.jits`);
- a timed window of n calls: `Pace.step_s(n)` from the judge's order; while the judge fills and
  checks (its own time, not the worker's) only the run timeout;
- after the last window (the run's report): `HANG_FLOOR_S`;
- "variants" (sizes the baseline never timed): the run timeout.
A worker that sends steps it is not at only moves its own deadline, never past the run
timeout. Without a pace (no baseline) every step has the run timeout.
"""

from __future__ import annotations

import time
from typing import Any

from verifier.judge.pace import (
    FIRST_CALL_S,
    HANG_FACTOR,
    HANG_FLOOR_S,
    JIT_FIRST_CALL_S,
    LOAD_FACTOR,
    Pace,
)

ONE_CALL = ("trial", "kernels", "performance")  # steps of one call of the candidate
MEASURED = ("trial", "kernels")  # ("performance" ends where the clock's windows begin, unseen)


class HangWatch:
    """The deadline of the step the job in flight is at (`deadline`), and why it ended it."""

    def __init__(self, pace: Pace | None, start: float, timeout_s: float,
                 jit: bool = False) -> None:
        """`jit`: the candidate may compile at its first call (`verifier.judge.pace.jits`)."""
        self.pace, self.start, self.timeout_s = pace, start, timeout_s
        self.first_s = JIT_FIRST_CALL_S if jit else FIRST_CALL_S
        self.hard = start + timeout_s
        self.end, self.what, self.budget = self.hard, "the reference's load", timeout_s
        self.clock_seen = False
        self.first_call = True
        self.began, self.kind = start, ""  # the step in flight: when, and which (`spent`)
        self.calls: dict[str, float] = {}  # "first_call", "call_max": seconds, as they ended

    def on(self, step: str, now: float | None = None) -> None:
        """The worker began `step` (a progress or step line)."""
        now = time.monotonic() if now is None else now
        self._ended(now)
        self.began, self.kind = now, step
        if self.pace is None:
            return
        if step == "correctness":  # the reference is loaded: the candidate loads next
            self._step(now, HANG_FLOOR_S + LOAD_FACTOR * (now - self.start),
                       f"loading the candidate (the reference loaded in {now - self.start:.1f} s)")
        elif step in ONE_CALL:
            first, self.first_call = self.first_call, False
            self._step(now, self.pace.step_s(1) + (self.first_s if first else 0.0),
                       f"{step}: one call" + (" (the first)" if first else ""))
        else:  # variants (sizes never timed), done, anything else: the run timeout
            self._step(now, self.hard - now, step)

    def _ended(self, now: float) -> None:
        """The step in flight ended at `now`: a call's seconds, kept for the profile (what the
        floor of a first call and of a later one is measured against)."""
        if self.kind in MEASURED:
            key = "call_max" if "first_call" in self.calls else "first_call"
            self.calls[key] = max(self.calls.get(key, 0.0), now - self.began)
        self.kind = ""

    def spent(self) -> dict[str, float]:
        """The seconds of the job's first call and of its slowest later one (trials, the kernel
        profile), for the profile (`verifier.run.spans`)."""
        self._ended(time.monotonic())
        return dict(self.calls)

    def _step(self, now: float, budget: float, what: str) -> None:
        self.end, self.budget, self.what = min(self.hard, now + budget), budget, what

    def _see(self, clock: Any, now: float | None) -> None:
        """Take in the judge's clock as it is now: once its windows are over, the worker's report
        is the next step (seen by whichever of `deadline` and `why` is asked first)."""
        if self.pace is None or clock is None:
            return
        if clock.serving:
            self.clock_seen = True
        elif self.clock_seen:  # the windows are over: the worker's report is next
            self.clock_seen = False
            self._step(time.monotonic() if now is None else now, HANG_FLOOR_S,
                       "the run's report after its windows")

    def _current(self, clock: Any, now: float | None) -> tuple[float, float, str]:
        """(deadline, budget, what) of the step the job is at, the judge's clock as it is now
        taken in first."""
        self._see(clock, now)
        if self.pace is not None and clock is not None and clock.serving:
            window = clock.open_window
            if window is None:  # the judge fills or checks: its time, not the worker's
                return self.hard, self.budget, self.what
            began, calls = window
            budget = self.pace.step_s(calls)
            return min(self.hard, began + budget), budget, f"a timed window of {calls} calls"
        return (self.end if self.pace is not None else self.hard), self.budget, self.what

    def deadline(self, clock: Any = None, now: float | None = None) -> float:
        """When the job must next show progress (monotonic), the judge's clock (the job's, as
        it is at `now`) considered."""
        return self._current(clock, now)[0]

    def why(self, clock: Any = None, now: float | None = None) -> str:
        """Why the job was ended, when its step's deadline (not the run timeout) passed; ""
        when it is the run timeout. `clock`: as for `deadline`."""
        end, budget, what = self._current(clock, now)
        if self.pace is None or end >= self.hard:
            return ""
        return (f"passed its hang deadline: {what} may take {budget:.1f} s, scaled to "
                f"the reference's {self.pace.eager_s * 1e6:.0f} us a call "
                f"({self.pace.call_floor_s:g} s + "
                f"{HANG_FACTOR:g}x a call; the run timeout is {self.timeout_s:.0f} s)")
