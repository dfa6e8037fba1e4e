"""Where each candidate's time went, from a `--profile` batch's `<out>.timings.jsonl` and its
verdicts: per span (the runner's steps, the referee's, the worker's phases), the sum, median,
90th percentile and largest over the candidates, and the seconds of each run's first call
(`verifier.run.hang_watch.HangWatch.spent`) by status: what the hang deadlines' floor is
measured against.

    python -m benchmarks.job_spans OUT.timings.jsonl OUT [--top 5]

Stdlib only (it runs on the GPU node beside the batch)."""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]


def _q(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


def spans_of(timing: dict[str, Any]) -> dict[str, float]:
    """One candidate's spans and worker phases, by name (seconds)."""
    out = {k: float(v) for k, v in (timing.get("spans") or {}).items()
           if isinstance(v, int | float)}
    out.update({f"worker {k}": float(v) for k, v in (timing.get("phase_s") or {}).items()
                if isinstance(v, int | float)})
    if isinstance(timing.get("exec_s"), int | float):
        out["exec"] = float(timing["exec_s"])
    return out


def table(timings: list[dict[str, Any]], verdicts: dict[str, dict[str, Any]],
          top: int = 5) -> str:
    """The spans' table, the first calls by status, and the `top` candidates by exec time."""
    by_span: dict[str, list[float]] = defaultdict(list)
    firsts: dict[str, list[float]] = defaultdict(list)
    later: dict[str, list[float]] = defaultdict(list)
    execs = []
    for row in timings:
        spans = spans_of(row)
        for k, v in spans.items():
            by_span[k].append(v)
        status = (verdicts.get(row.get("candidate_id", "")) or {}).get("status", "?")
        if "first_call" in spans:
            firsts[status].append(spans["first_call"])
        if "call_max" in spans:
            later[status].append(spans["call_max"])
        execs.append((spans.get("exec", 0.0), row.get("candidate_id", "?"), status))
    lines = ["| span | n | sum s | median s | p90 s | max s |", "| --- | --- | --- | --- | --- | --- |"]
    for k in sorted(by_span, key=lambda k: -sum(by_span[k])):
        xs = by_span[k]
        lines.append(f"| {k} | {len(xs)} | {sum(xs):.1f} | {statistics.median(xs):.3f} | "
                     f"{_q(xs, 0.9):.3f} | {max(xs):.3f} |")
    lines += ["", "| status | runs | first call median s | p90 s | max s | later call max s |",
              "| --- | --- | --- | --- | --- | --- |"]
    for status in sorted(firsts):
        xs, ys = firsts[status], later.get(status) or [0.0]
        lines.append(f"| {status} | {len(xs)} | {statistics.median(xs):.3f} | "
                     f"{_q(xs, 0.9):.3f} | {max(xs):.3f} | {max(ys):.3f} |")
    lines += ["", f"slowest {top} candidates (exec s, status):"]
    lines += [f"- {cid}: {s:.1f} s, {status}" for s, cid, status in sorted(execs)[::-1][:top]]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("timings", type=Path)
    ap.add_argument("verdicts", type=Path, help="the batch's --out (JSON lines)")
    ap.add_argument("--top", type=int, default=5)
    args = ap.parse_args()
    verdicts = {v["candidate_id"]: v for v in _rows(args.verdicts)} \
        if args.verdicts.exists() else {}
    print(table(_rows(args.timings), verdicts, args.top))


if __name__ == "__main__":
    main()
