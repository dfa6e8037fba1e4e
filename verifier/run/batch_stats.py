"""Where one `verify_batch` spends its wall time: timestamped spans per phase and lane.

Phases: `front` (extract and Python static checks), `collect` (sandboxed runs that find
load_inline calls), `pch`, `compile` (one span per build unit, lane = compile thread),
`baseline` (eager/torch.compile timing of a task's reference, lane = execution slot), `exec`
(one candidate on an execution slot), `exec_wait` (a built candidate waiting for a free slot),
`worker_start` (a GPU worker importing torch and warming up). The summary says, per phase, how
many spans, their summed seconds, the wall seconds they covered (union) and when they first
started and last ended; per execution lane how busy it was and how long it sat idle while
candidates were still compiling. Cheap: two monotonic clock reads per span.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class BatchStats:
    """Spans (phase, lane, start, end) of one batch, relative to its start."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.spans: list[tuple[str, str, float, float]] = []
        self.lock = threading.Lock()
        self.counters: dict[str, float] = {}

    def add(self, phase: str, start: float, end: float, lane: str = "") -> None:
        with self.lock:
            self.spans.append((phase, lane, start - self.t0, end - self.t0))

    def count(self, name: str, value: float = 1.0) -> None:
        with self.lock:
            self.counters[name] = self.counters.get(name, 0.0) + value

    @contextmanager
    def span(self, phase: str, lane: str = "") -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        finally:
            self.add(phase, start, time.monotonic(), lane)

    def summary(self, wall_s: float | None = None) -> dict[str, Any]:
        """Per-phase and per-lane figures (seconds), JSON-ready."""
        with self.lock:
            spans = list(self.spans)
            counters = dict(self.counters)
        wall = wall_s if wall_s is not None else time.monotonic() - self.t0
        phases: dict[str, dict[str, float]] = {}
        for phase in dict.fromkeys(p for p, _, _, _ in spans):
            mine = [(s, e) for p, _, s, e in spans if p == phase]
            phases[phase] = {"n": len(mine), "sum_s": round(sum(e - s for s, e in mine), 3),
                             "covered_s": round(_union(mine), 3),
                             "first_s": round(min(s for s, _ in mine), 3),
                             "last_s": round(max(e for _, e in mine), 3)}
        compile_end = max((e for p, _, _, e in spans if p == "compile"), default=0.0)
        lanes: dict[str, dict[str, float]] = {}
        for lane in sorted({ln for p, ln, _, _ in spans if p in ("exec", "baseline")}):
            busy = [(s, e) for p, ln, s, e in spans if ln == lane and p in ("exec", "baseline")]
            before = [(s, min(e, compile_end)) for s, e in busy if s < compile_end]
            ready = max((e for p, ln, _, e in spans if ln == lane and p == "worker_start"),
                        default=0.0)
            lanes[lane] = {"busy_s": round(_union(busy), 3),
                           "busy_frac": round(_union(busy) / wall, 4) if wall else 0.0,
                           "idle_while_compiling_s": round(
                               max(0.0, compile_end - ready - _union(before)), 3),
                           "jobs": len(busy)}
        return {"wall_s": round(wall, 3), "phases": phases, "lanes": lanes,
                "counters": counters}


def _union(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by the intervals (overlaps counted once)."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def profile_table(summary: dict[str, Any]) -> str:
    """The summary as a fixed-width text table (benchmarks print it)."""
    wall = summary["wall_s"] or 1e-9
    lines = [f"{'phase':14} {'n':>5} {'sum s':>9} {'covered s':>10} {'% wall':>7} "
             f"{'first s':>8} {'last s':>8}"]
    for name, p in summary["phases"].items():
        lines.append(f"{name:14} {p['n']:5d} {p['sum_s']:9.1f} {p['covered_s']:10.1f} "
                     f"{p['covered_s'] / wall:7.0%} {p['first_s']:8.1f} {p['last_s']:8.1f}")
    for lane, d in summary["lanes"].items():
        lines.append(f"lane {lane}: {int(d['jobs'])} jobs, busy {d['busy_s']:.1f}s "
                     f"({d['busy_frac']:.0%} of {wall:.1f}s wall), idle while candidates "
                     f"compiled {d['idle_while_compiling_s']:.1f}s")
    for name, value in sorted(summary.get("counters", {}).items()):
        lines.append(f"{name}: {value:.3f}" if value % 1 else f"{name}: {int(value)}")
    return "\n".join(lines)
