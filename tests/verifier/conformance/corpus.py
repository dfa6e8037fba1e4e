"""Load the conformance corpus (manifest + case files + tasks) and judge verdicts against it.

Shared by tests/verifier/test_conformance.py (CPU cases, and CUDA cases compile-only) and
benchmarks/conformance_gpu.py (CUDA cases on a GPU). Stdlib and verifier.protocol only.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from verifier.protocol import CORRECT_STATUSES

HERE = Path(__file__).parent
POLICIES = ("strict", "partial")
CORRECT = CORRECT_STATUSES


def load(backend: str | None = None) -> list[dict]:
    """Manifest rows (with `code` and `task_source`), optionally of one backend."""
    rows = json.loads((HERE / "manifest.json").read_text())
    out = []
    for r in rows:
        if backend and r["backend"] != backend:
            continue
        r = dict(r, code=(HERE / r["file"]).read_text(),
                 task_source=(HERE / "tasks" / f"{r['task']}.py").read_text())
        out.append(r)
    return out


def matches(expected: str, status: str, compile_only: bool = False) -> bool:
    """Does a status meet an expectation? compile-only runs: anything past the compile stage
    is `compiled`."""
    if compile_only and expected not in ("static_reject", "compile_error", "format_error"):
        return status == "compiled"
    if expected == "correct":
        return status in CORRECT
    return status == expected


def table(rows: list[dict], verdicts: dict[str, dict[str, dict]], compile_only: bool = False
          ) -> str:
    """Per-status counts for both policies, then every case whose verdict differs."""
    lines = ["| status | " + " | ".join(POLICIES) + " |", "|---|" + "---|" * len(POLICIES)]
    counts = {p: Counter(v["status"] for v in verdicts[p].values()) for p in POLICIES}
    for s in sorted(set().union(*counts.values())):
        lines.append(f"| {s} | " + " | ".join(str(counts[p][s]) for p in POLICIES) + " |")
    ok = {p: sum(matches(r[p], verdicts[p][r["name"]]["status"], compile_only) for r in rows)
          for p in POLICIES}
    lines.append("| **as expected** | " + " | ".join(f"{ok[p]}/{len(rows)}" for p in POLICIES)
                 + " |")
    bad = [(p, r, verdicts[p][r["name"]]) for p in POLICIES for r in rows
           if not matches(r[p], verdicts[p][r["name"]]["status"], compile_only)]
    if bad:
        lines += ["", "Differences (policy, case, expected, got, error):"]
        lines += [f"- {p} {r['name']}: expected {r[p]}, got {v['status']}: "
                  f"{(v.get('error') or '')[:160]}" for p, r, v in bad]
    return "\n".join(lines)
