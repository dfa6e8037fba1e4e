"""One job's result in the worker: the measurements so far, the findings, and the outcome that
ends the run (and how a sandboxed child writes it: whole or not at all)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


class Finished(BaseException):  # noqa: N818 - control flow, not an error
    """Raised by `JobResult.finish`; a BaseException so no `except Exception` swallows it."""


def write_json(name: str, data: dict) -> None:
    """`data` as JSON in the file `name`, whole or not at all (written aside, then renamed)."""
    tmp = Path(f".{name}.tmp")
    tmp.write_text(json.dumps(data, default=str), encoding="utf-8")
    os.replace(tmp, name)


class JobResult:
    """What one job measured (`data`, the worker's result), and how the run ends: `finish`
    records the outcome and raises Finished."""

    def __init__(self, nonce: str, on_progress: Callable[[str], None] | None = None,
                 on_step: Callable[[str], None] | None = None,
                 on_measure: Callable[[dict[str, Any]], None] | None = None):
        self.data: dict[str, Any] = {"nonce": nonce, "stage": "correctness", "outcome": "ok",
                                     "findings": [], "error": ""}
        self.on_progress, self.on_step, self.on_measure = on_progress, on_step, on_measure
        self.io: Any = None  # the run's trial inputs and outputs (`verifier.judge.trial_io`)

    def progress(self, stage: str) -> None:
        self.data["stage"] = stage
        if self.on_progress:
            self.on_progress(stage)

    def step(self, name: str) -> None:
        """A step within the stage (a trial, the kernel profile): the parent's hang deadline
        of the next one starts now (`verifier.run.hang_watch`); the stage is unchanged."""
        if self.on_step:
            self.on_step(name)

    def measured(self, fields: dict[str, Any]) -> None:
        """Figures sent to the parent the moment they are measured, before the candidate's
        code runs again (the result is the candidate's to write until the job ends: the
        verdict takes the parent's copy, `verifier.run.outcome.Measured`)."""
        self.data.update(fields)
        if self.on_measure:
            self.on_measure(fields)

    def finish(self, outcome: str, error: str = "") -> None:
        self.data["outcome"] = outcome
        if error:
            self.data["error"] = error[:4000]
        raise Finished

    def finding(self, rule: str, message: str, line: int | None = None,
                severity: str = "error") -> None:
        self.data["findings"].append({"rule": rule, "message": message, "line": line,
                                      "severity": severity})
