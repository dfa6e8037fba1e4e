"""How an exception the candidate raised is reported: its last line in candidate.py and the
exception in one line (the feedback a model gets)."""

from __future__ import annotations

import traceback


def candidate_traceback(exc: BaseException) -> tuple[str, int | None]:
    """Last candidate.py frame and the exception, one line."""
    line = None
    for fr in traceback.extract_tb(exc.__traceback__):
        if fr.filename == "candidate.py":
            line = fr.lineno
    msg = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    if line:
        msg = f"candidate.py line {line}: {msg}"
    return msg[:2000], line
