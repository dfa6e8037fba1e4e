"""A probe job's time budget: its base seconds plus its FLOPs at GPU size (one forward, counted
on meta) at a conservative host rate, capped; enforced inside the job's child by a timer that
writes a `timed out` verdict. The fork server's own deadline, the cap, is the backstop.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

_STARTED = [time.monotonic()]
_TIMER: list[threading.Timer] = []


def time_budget(flops: float, base_s: float, host_flops: float, max_s: float) -> float:
    """Seconds a task may take: `base_s` plus `flops / host_flops`, at most `max_s`: a deep
    model's meta scaling loop and CPU checks take longer than an elementwise op's."""
    return min(max_s, base_s + flops / host_flops)


def start_clock() -> None:
    """The budget runs from here (after torch's import: a loaded host's slow interpreter start
    is no fault of the task)."""
    _STARTED[0] = time.monotonic()


def start_budget(job: dict, flops: float | None, write: Callable[[dict], None]) -> None:
    """End this process with `write(verdict)` when the budget runs out; `flops=None`: the cap,
    while the FLOPs are being counted; a later call replaces the earlier timer."""
    if not job.get("budget_s"):
        return
    base, cap = float(job["budget_s"]), float(job.get("max_budget_s", job["budget_s"]))
    if flops is None:
        budget, why = cap, "while counting FLOPs"
    else:
        budget = time_budget(flops, base, float(job.get("host_flops", 1e9)), cap)
        why = f"budget {base:.0f}s + {flops / 1e9:.1f} GFLOP at GPU size"
    left = budget - (time.monotonic() - _STARTED[0])

    def expire() -> None:
        write({"ok": False, "valid": False, "reason": "timeout",
               "detail": f"timed out after {budget:.0f}s ({why})"})
        os._exit(0)

    for old in _TIMER:
        old.cancel()
    timer = threading.Timer(max(0.0, left), expire)
    timer.daemon = True
    timer.start()
    _TIMER[:] = [timer]
