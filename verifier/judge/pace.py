"""The reference's pace: its eager time per call, as the trusted baseline measured it
(`verifier.run.baselines`, timed in a process that never ran candidate code). Two rules of a run
rest on it, so a run costs what its task costs, not a flat budget:

- **Settled timing** (`settled`): a correct candidate whose timed window, at least `TARGET_S`
  long, already shows it more than `SETTLE_RATIO` x (1 + the baseline's own spread) slower than
  eager is `correct_slow` whatever the other windows show: the runtime is the fastest window,
  load only ever adds time, so more windows could lower its figure only by what load added to
  this one, and a window inflated 3x by load is far past any spread measured (GPU windows:
  under 15%). The judge stops timing there (`verifier.judge.clock`); the verdict says so (an
  info finding `timing_settled`) and its speedup is that window's: a 1 s call 10x behind eager
  costs 1 window of 1 call, where it cost a calibration window and 3 windows of 3 calls.
- **Hang deadlines** (`step_s`): a step of a run that calls the candidate `calls` times (a
  trial, the kernel profile, a timed window of n calls) must end within its floor
  (`call_floor_s`) + `HANG_FACTOR` x eager x calls (the first call `first_call_s` more), and
  loading the candidate within `HANG_FLOOR_S` + `LOAD_FACTOR` x the reference's own load
  (`verifier.run.hang_watch`); a run past it is a `timeout` whose reason names the deadline, long before the flat run timeout. Why these numbers: an honest
  kernel 50x slower than eager uses half of HANG_FACTOR; the other half covers the harness's
  work that grows with the call (the dispatcher trace of a trial, the copy of every output
  into the judge's slot: at most one more eager call for an elementwise op), and the floor a
  step's fixed costs on a host whose cores also compile (16 nvcc beside the worker), with
  margin. A GPU's call steps get `DEVICE_CALL_FLOOR_S`: over KernelBench's 149 runs on an H100 a
  later call took at most 0.54 s and a whole correctness phase 0.67 s (`job_spans`), while each
  of its 3 hanging candidates waited the floor out twice (the cpu loop, whose host may be a
  loaded 2-core CI runner, keeps `HANG_FLOOR_S`). A first call's lazy loads (the kernel's
  module, cuBLAS/cuDNN handles, the caching allocator's first GB-sized blocks) took at most 0.13
  s over KernelBench's 146 first calls on an H100 (median 0.04 s; `benchmarks/job_spans.py`):
  `FIRST_CALL_S` more, 8x that; a candidate that compiles at its first call (Triton,
  torch.compile, CuPy, Numba, NVRTC: `jits`) keeps `JIT_FIRST_CALL_S`. Each hanging candidate
  waits its deadline out twice after earlier jobs (its confirmation in a fresh worker,
  `verifier.run.outcome`). A candidate's model is built from the same init inputs as the
  reference's (the same weights: the reference's own load is the measure); 3x
  covers a layout change of every weight. Steps with no such measure (the generalisation
  variants, at sizes never timed) keep the run timeout.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

SETTLE_RATIO = 3.0  # slower than eager by this (x its spread) in one long window: settled
SETTLE_MIN_S = 0.02  # the settling window is at least this long (clock.TARGET_S)
HANG_FLOOR_S = 5.0  # every step's fixed allowance
DEVICE_CALL_FLOOR_S = 2.5  # a call's step on a GPU (its host's load is the batch's compiles)
HANG_FACTOR = 100.0  # eager calls' worth a call may take (an honest kernel: up to 50x eager)
LOAD_FACTOR = 3.0  # the reference's own load time the candidate's load may take
FIRST_CALL_S = 1.0  # a first call's lazy loads (a prebuilt extension's: at most 0.13 s seen)
JIT_FIRST_CALL_S = 5.0  # a first call that compiles its kernel (`jits`)
_JIT = re.compile(r"triton|torch\s*\.\s*compile|_dynamo|torch\s*\.\s*jit|cupy|numba|nvrtc|"
                  r"\bjit\b", re.I)


def jits(candidate_source: str) -> bool:
    """Whether a candidate may compile its kernel at its first call (a JIT's name in its
    source): its first call keeps `JIT_FIRST_CALL_S`. A candidate that hides its JIT only
    shortens its own deadline."""
    return bool(_JIT.search(candidate_source or ""))


@dataclass(frozen=True)
class Pace:
    """The reference's eager seconds per call and the relative spread of its windows."""

    eager_s: float
    spread: float = 0.0
    call_floor_s: float = HANG_FLOOR_S  # a call's step's fixed allowance (`step_s`)

    @classmethod
    def of(cls, base: dict[str, Any] | None, backend: str = "cpu") -> Pace | None:
        """The pace of a baseline's figures (`eager_us`, `eager_iqr_us`: over three windows,
        their range) on `backend`; None without one."""
        eager_us = float((base or {}).get("eager_us") or 0.0)
        if not eager_us > 0:
            return None
        spread = float((base or {}).get("eager_iqr_us") or 0.0) / eager_us
        return cls(eager_s=eager_us * 1e-6, spread=max(0.0, spread),
                   call_floor_s=HANG_FLOOR_S if backend == "cpu" else DEVICE_CALL_FLOOR_S)

    def settled(self, per_call_s: float, window_s: float) -> str:
        """Why one window settles the verdict as slow ("" when it does not): at least
        SETTLE_MIN_S long, and slower than eager by more than SETTLE_RATIO x its spread."""
        bound = SETTLE_RATIO * (1.0 + self.spread)
        if window_s < SETTLE_MIN_S or not per_call_s > bound * self.eager_s:
            return ""
        return (f"timing settled after one window: {per_call_s / self.eager_s:.1f}x slower than "
                f"eager ({per_call_s * 1e6:.0f} vs {self.eager_s * 1e6:.0f} us a call), past "
                f"{bound:.1f}x: more windows could lower it only by what load added to it)")

    def step_s(self, calls: int) -> float:
        """The hang deadline of a step that calls the candidate `calls` times."""
        return self.call_floor_s + HANG_FACTOR * self.eager_s * max(1, calls)
