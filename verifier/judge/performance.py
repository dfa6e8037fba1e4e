"""The performance stage's verdict, from the judge's figures alone: the runtime its clock
measured (`verifier.judge.clock`), baselines timed in processes that never ran candidate code
(`verifier.run.baselines`), and the physics floor (`verifier.judge.floor`). Nothing the worker reports
is a figure here."""

from __future__ import annotations

from typing import Any

from verifier.judge.clock import NO_JUDGE
from verifier.judge.reward import speedup_of
from verifier.judge.trial_pace import timed_finding
from verifier.protocol import VerdictData, VerifyOptions

_CHEATS = ("the output of a timed call was wrong", "forward modified its input tensors")


def judge_performance(v: VerdictData, opts: VerifyOptions, clock: dict[str, Any] | None,
                      base: dict[str, Any], peaks: dict[str, Any] | None, flops: float = 0.0,
                      bytes_moved: float = 0.0) -> tuple[str, str]:
    """(status, why) of a run whose outputs the judge accepted: `correct_fast`/`correct_slow`,
    `cheat` (timed calls that fail the judge's checks or beat the floor), `runtime_error`
    (the verifier's own judge failed). Fills the verdict's runtime, baselines and speedups."""
    clock = clock or {"figures": {}, "failure": "", "judge_error": "no timing judge ran"}
    figures, failure = clock.get("figures") or {}, clock.get("failure", "")
    if failure:
        v.findings.append({"rule": "judge_clock", "message": failure, "line": None,
                           "severity": "error"})
        return "cheat", ("the timed calls failed the verifier's checks: " + failure
                         if failure.startswith(_CHEATS) else failure)
    if str(clock.get("judge_error", "")).startswith(NO_JUDGE):  # correct, but untimed here
        v.findings.append({"rule": "untimed", "message": clock["judge_error"], "line": None,
                           "severity": "warning"})
        return "correct_slow", ""
    if clock.get("judge_error") or not figures.get("runtime_us"):
        return "runtime_error", (clock.get("judge_error")
                                 or "the verifier's clock measured no timing windows")
    v.runtime_us, v.runtime_iqr_us = float(figures["runtime_us"]), figures.get("iqr_us")
    if figures.get("early_stop"):  # one window settled it (`verifier.judge.pace`)
        v.findings.append({"rule": "timing_settled", "message": figures["early_stop"],
                           "line": None, "severity": "info"})
    why = timed_finding(figures)  # the judge's windows against its trials
    if why:
        v.findings.append({"rule": "timed_not_traced", "message": why, "line": None,
                           "severity": "error"})
        return "cheat", why
    why = _floor(v, peaks, figures, flops, bytes_moved)
    if why:
        v.findings.append({"rule": "physics_floor", "message": why, "line": None,
                           "severity": "error"})
        return "cheat", why
    return judge_speed(v, opts, base), ""


def judge_speed(v: VerdictData, opts: VerifyOptions, base: dict[str, Any]) -> str:
    """The status of a correct, timed run (`correct_fast`/`correct_slow`) from its runtime and
    the task's baselines; fills the verdict's baselines and speedups. Also for a verdict whose
    baseline is timed again (`verifier.run.baselines.Baselines.retime`)."""
    v.eager_us, v.compiled_us = base.get("eager_us"), base.get("compiled_us")
    v.speedup = speedup_of(v.eager_us, v.runtime_us)
    v.speedup_compiled = speedup_of(v.compiled_us, v.runtime_us)
    v.faster = v.speedup is not None and v.speedup > opts.fast_threshold
    return "correct_fast" if v.faster else "correct_slow"


def _floor(v: VerdictData, peaks: dict[str, Any] | None, figures: dict[str, Any],
           flops: float, bytes_moved: float) -> str:
    """Why the runtime is below what the device allows ("" when it is not)."""
    if not peaks:
        return ""
    from verifier.judge.floor import below_floor

    # the output must be written; the task's own estimate of what must move, when it has one
    moved = max(float(figures.get("out_bytes") or 0), float(bytes_moved or 0))
    return below_floor(v.runtime_us, peaks, moved, float(flops or 0))
