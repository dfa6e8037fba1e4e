"""Reward and feedback, computed by the parent from a verdict (never by the candidate's process).

Hierarchical reward in [0, 1] (documented in the verdict's `reward_components`):
    format_error / static_reject / cheat           0.0
    compile_error                                  0.05  (parsed, passed static checks)
    runtime_error / timeout                        0.1   (compiled)
    incorrect                                      0.2   (ran to completion)
    compiled (a --compile-only run)                0.1
    does_not_fit (the task's run cannot fit)       excluded: 0.0, components say `excluded`
    correct_slow / correct_fast                    0.5 + 0.5 * s,  s = min(1, log2(1 + speedup) / 2)
so any correct kernel beats any incorrect one, and the speedup scales the rest (s reaches 1 at a
3x speedup; a correct kernel with no timing gets 0.5 + 0.5 * 0.5 = 0.75 at speedup 1).
The speedup is the judge's: its own windows against a baseline timed where no candidate ran.
Under the `partial` fallback policy (library ops allowed beside an own kernel) the reward is the
same function of that speedup: the library's speed is in the eager baseline too, so a kernel
that leaves the work to cuBLAS gets about 1x, and only what it adds earns more. The share of
device time in the candidate's own kernels (`own_share`, from the profiler on CUDA) is kept in
the components as a diagnostic and never scales the reward: it is measured in the candidate's
process, where a trial call can rewrite it (red-team round 15: a forged 1.0), and no number
from that process is a figure of the reward. Every verdict's components record `fallback`
(the policy) and `own_share` (None: not measured).
"""

from __future__ import annotations

import json
import math
from typing import Any

from verifier.checks.namespace import name_error_hint
from verifier.protocol import EXCLUDED_STATUSES, VerdictData

BASE = {"format_error": 0.0, "static_reject": 0.0, "cheat": 0.0, "compile_error": 0.05,
        "runtime_error": 0.1, "timeout": 0.1, "compiled": 0.1, "incorrect": 0.2}


SPEEDUP_DIGITS = 4  # significant digits a speedup keeps


def speedup_of(baseline_us: float | None, runtime_us: float | None) -> float | None:
    """baseline / runtime to SPEEDUP_DIGITS significant digits (None without both): a kernel
    6000x behind eager is 1.667e-04, not a rounded 0.0."""
    if not baseline_us or not runtime_us:
        return None
    ratio = baseline_us / runtime_us
    return float(f"{ratio:.{SPEEDUP_DIGITS}g}")


def _times(speedup: float) -> str:
    return f"{speedup:.2f}" if speedup >= 0.1 else f"{speedup:.2g}"


def record_share(v: VerdictData, own_share: float | None, own_calls: int | None) -> None:
    """Keep the worker's own-kernel measurements in the verdict's components (finalize keeps
    them): `own_share` of device time, `own_calls` into the extension during forward."""
    comps = json.loads(v.reward_components or "{}")
    comps.update(own_share=own_share, own_calls=own_calls)
    v.reward_components = json.dumps(comps)


def reward_of(v: VerdictData, policy: str = "strict") -> tuple[float, dict[str, Any]]:
    """(reward, components) for a verdict."""
    measured = json.loads(v.reward_components or "{}")
    share = measured.get("own_share")
    extra = {"fallback": policy, "own_share": share, "own_calls": measured.get("own_calls")}
    if v.status in EXCLUDED_STATUSES:  # the task's fault: no reward either way
        return 0.0, {"level": v.status, "base": 0.0, "speed": 0.0, "excluded": True, **extra}
    if v.status in BASE:
        r = BASE[v.status]
        return r, {"level": v.status, "base": r, "speed": 0.0, **extra}
    # a speedup of 0.0 is a (very slow) speedup, not a missing timing
    speed = min(1.0, math.log2(1.0 + max(0.0, v.speedup)) / 2.0) if v.speedup is not None \
        else 0.5
    r = 0.5 + 0.5 * speed
    return round(r, 6), {"level": v.status, "base": 0.5, "speed": round(speed, 6),
                         "speedup": v.speedup, **extra}


def _first_errors(log: str, limit: int = 5) -> list[str]:
    lines = [ln for ln in log.splitlines() if " error" in ln or ln.startswith("error")
             or "undefined symbol" in ln]
    return lines[:limit]


def feedback_of(v: VerdictData) -> str:
    """Natural-language feedback for a repair prompt."""
    s = v.status
    if s == "format_error":
        return f"Your answer could not be used: {v.error}. Reply with one Python code block " \
               "defining `class ModelNew(nn.Module)` with the same constructor and forward " \
               "signature as Model."
    if s in ("static_reject", "cheat"):
        items = [f"- {f['rule']}: {f['message']}" + (f" (line {f['line']})" if f.get("line")
                                                       else "") for f in v.findings[:6]]
        what = "was rejected before running" if s == "static_reject" else \
            "was caught computing the result in a forbidden way"
        return (f"The kernel {what}:\n" + "\n".join(items) + "\nCompute the output in your own "
                "kernel code; forward may only allocate outputs, reshape/view tensors and call "
                "your extension functions.")
    if s == "compile_error":
        errs = _first_errors(v.compile_log) or [v.error or v.compile_log.strip()[:500]]
        return "The extension failed to compile. First errors:\n" + "\n".join(errs[:5])
    if s == "runtime_error":
        hint = name_error_hint(v.error, v.findings)
        return f"The kernel compiled but failed at run time: {v.error}" + (
            f"\n{hint}." if hint else "")
    if s == "does_not_fit":
        return (f"Not judged: the task's run does not fit the device's memory ({v.error}). "
                "This says nothing about the kernel.")
    if s == "timeout":
        return f"The kernel did not finish in time ({v.error}). Look for infinite loops or " \
               "far too much work per element."
    if s == "incorrect" and v.error.startswith("generalisation check"):
        return f"The kernel is right only at the sizes and constructor arguments it was written for: {v.error}"
    if s == "incorrect":
        stats = ""
        if v.max_abs_diff is not None:
            stats = (f" (max abs diff {v.max_abs_diff:.4g}, mean abs diff "
                     f"{(v.mean_abs_diff or 0):.4g}, mismatching fraction "
                     f"{(v.mismatch_frac or 0):.3g})")
        return f"The output is wrong: {v.error}{stats}. Check indexing, bounds and the math."
    if s == "compiled":
        return "The extension compiled (compile-only run; not executed)."
    if v.speedup is not None:
        if s == "correct_fast":
            return f"Correct and {_times(v.speedup)}x faster than PyTorch eager " \
                   f"({v.runtime_us:.1f} us vs {v.eager_us:.1f} us)."
        return f"Correct, but {_times(v.speedup)}x the speed of PyTorch eager ({v.runtime_us:.1f} " \
               f"us vs {v.eager_us:.1f} us); optimize memory access and parallelism."
    return "Correct."


def finalize(v: VerdictData, policy: str = "strict") -> VerdictData:
    """Fill reward, components and feedback from the verdict's other fields."""
    v.reward, comps = reward_of(v, policy)
    v.reward_components = json.dumps(comps)
    v.feedback = feedback_of(v)
    return v
