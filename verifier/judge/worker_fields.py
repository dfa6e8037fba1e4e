"""What the parent keeps of a worker's result beside the judge's own figures.

The worker that ran candidate code is the candidate's process: every field of its result is the
candidate's to write (frames from Python, `PyRun_SimpleString` from C++). Its findings, kernel
names, own-kernel share and diagnostics are kept in the verdict for the reader, never believed,
and only in the shapes the verifier reads them in: a diagnostic that was text where the batch
loop read a number ended `verify_batch` for every candidate of the batch; findings that were not
records ended it in the feedback; 60 MB of findings made a 60 MB verdict; a `generalised`
finding of the worker's own passed as the parent's generalisation check
(tests/verifier/test_redteam_round10.py).
"""

from __future__ import annotations

import math
from typing import Any

MAX_FINDINGS = 50  # the worker's own (the harness writes a few)
MAX_TEXT = 2000  # characters of a finding's message, a kernel name, a diagnostic's text
MAX_NAMES = 50  # kernel names (the worker keeps its first 50)
MAX_ITEMS = 1000  # of a diagnostic's list or dict

# findings the parent (or the dataset pipeline) writes from its own judgement: the worker's
# word for any of them is not taken
PARENT_RULES = frozenset({"forged_result", "generalised", "host_construction", "judge_clock",
                          "parent_check", "physics_floor", "timing_settled", "trials_admitted",
                          "untimed", "retimed"})


def number(value: Any) -> float | None:
    """`value` as a finite float when it is a number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _plain(value: Any, depth: int = 0) -> bool:
    """Whether `value` is a small JSON value of numbers, booleans, None and short text."""
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, (int, float)):
        return number(value) is not None
    if isinstance(value, str):
        return len(value) <= MAX_TEXT
    if depth >= 2:
        return False
    if isinstance(value, (list, tuple)):
        return len(value) <= MAX_ITEMS and all(_plain(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return len(value) <= MAX_ITEMS and all(
            isinstance(k, str) and _plain(v, depth + 1) for k, v in value.items())
    return False


def diagnostic(key: str, value: Any) -> bool:
    """Whether the worker's diagnostic `key` (`verifier.stages.TIMING_DIAGNOSTICS`) may be kept:
    a small plain value, and `phase_s` seconds per phase (numbers only)."""
    if key == "phase_s":
        return isinstance(value, dict) and len(value) <= MAX_ITEMS and all(
            isinstance(k, str) and number(v) is not None for k, v in value.items())
    return _plain(value)


def findings(value: Any) -> list[dict[str, Any]]:
    """The worker's findings as the verdict keeps them: records with a text rule and message
    (cut to MAX_TEXT), at most MAX_FINDINGS, none of the parent's own rules."""
    if not isinstance(value, list):
        return []
    out = []
    for f in value:
        if not (isinstance(f, dict) and isinstance(f.get("rule"), str)
                and isinstance(f.get("message"), str)) or f["rule"] in PARENT_RULES:
            continue
        line = f.get("line")
        out.append({"rule": f["rule"][:100], "message": f["message"][:MAX_TEXT],
                    "line": line if isinstance(line, int) and not isinstance(line, bool)
                    else None, "severity": str(f.get("severity", "error"))[:20]})
        if len(out) == MAX_FINDINGS:
            break
    return out


def kernel_names(value: Any) -> list[str]:
    """The worker's kernel names: text, at most MAX_NAMES, each cut to MAX_TEXT."""
    if not isinstance(value, list):
        return []
    return [k[:MAX_TEXT] for k in value if isinstance(k, str)][:MAX_NAMES]


def share(value: Any) -> float | None:
    """The worker's own-kernel share: a number in [0, 1], else None (not measured)."""
    v = number(value)
    return v if v is not None and 0.0 <= v <= 1.0 else None


def count(value: Any) -> int | None:
    """A count the worker reports (its own-kernel calls): a non-negative int, else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else None
