"""Speed labels that hold: a teacher kernel near the `select.min_speedup` gate is timed twice.

On a loaded host one timing of a kernel at parity with eager lands on either side of 1.0x, so
an sft answer resting on it is luck. The verify stage therefore verifies again every correct
teacher kernel whose speedup is at least `select.min_speedup` but under `select.retime_below`
times it, and records the second timing on the first verdict as an `info` finding `retimed`
(its speedup, runtime, spread and eager, the judge's figures both times). Publishing teaches a
kernel as at least `min_speedup` only when every timing of it says so (`timing_held`); one that
did not hold is left out with a `timing_not_repeated` rejection, and a task's answer is the
kernel whose slowest timing is fastest (`held_speedup`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace

from schemas import Candidate, Finding, Verdict
from verifier.protocol import CORRECT_STATUSES

RULE = "retimed"
TEACHERS = ("template:", "teacher:")
_FIGURE = re.compile(r"(\w+)=(-?[\d.]+|None)")


def needs_retime(c: Candidate, v: Verdict, min_speedup: float, retime_below: float) -> bool:
    """A correct teacher kernel whose one timing clears the gate by less than `retime_below`."""
    return (min_speedup > 0 and c.generator.startswith(TEACHERS)
            and v.status in CORRECT_STATUSES and v.speedup is not None
            and min_speedup <= v.speedup < retime_below * min_speedup
            and not retimings(v))


def retime_finding(second: Verdict) -> Finding:
    """The second timing as a finding of the first verdict (figures by name, parseable)."""
    speedup = second.speedup if second.status in CORRECT_STATUSES and second.speedup else 0.0
    return Finding(rule=RULE, severity="info", message=(
        f"timed again: speedup={speedup:.4f} runtime_us={second.runtime_us} "
        f"runtime_iqr_us={second.runtime_iqr_us} eager_us={second.eager_us} "
        f"status={second.status}"))


def retimings(v: Verdict) -> list[dict[str, float | None]]:
    """The figures of every `retimed` finding of `v` (speedup, runtime_us, ...)."""
    out = []
    for f in v.findings or []:
        if f.rule != RULE:
            continue
        figs = {k: (None if x == "None" else float(x)) for k, x in _FIGURE.findall(f.message)}
        out.append(figs)
    return out


def held_speedup(v: Verdict) -> float:
    """The slowest of the kernel's timings as a speedup (its one timing when never re-timed)."""
    speeds = [v.speedup or 0.0] + [r.get("speedup") or 0.0 for r in retimings(v)]
    return min(speeds)


def timing_held(v: Verdict, min_speedup: float) -> bool:
    """Every re-timing of `v` also clears `min_speedup` (true when it was never re-timed)."""
    return min_speedup <= 0 or all((r.get("speedup") or 0.0) >= min_speedup
                                   for r in retimings(v))


VerifyFn = Callable[..., tuple[list[Verdict], list]]


def retime_borderline(verdicts: list[Verdict], batch: list[Candidate], verify: VerifyFn,
                      min_speedup: float, retime_below: float) -> tuple[list[Verdict], int]:
    """`verdicts` with a `retimed` finding on each borderline teacher kernel, from a second
    `verify(batch_subset)`; and how many were re-timed."""
    by_id = {c.candidate_id: c for c in batch}
    todo = [by_id[v.candidate_id] for v in verdicts if v.candidate_id in by_id
            and needs_retime(by_id[v.candidate_id], v, min_speedup, retime_below)]
    if not todo:
        return verdicts, 0
    again = {v.candidate_id: v for v in verify(todo)}
    out = [replace(v, findings=[*(v.findings or []), retime_finding(again[v.candidate_id])])
           if v.candidate_id in again and v.candidate_id in {c.candidate_id for c in todo}
           else v for v in verdicts]
    return out, len(again)
