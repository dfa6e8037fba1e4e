"""What one job's run produced (`RunOutcome`), and which outcomes a persistent worker that ran
earlier jobs must have made again in a fresh worker before they stand.

A persistent worker (`verifier.run.gpu_worker`) runs one candidate after another, and any code
a job leaves behind that the hygiene checks miss runs in the later jobs: it can write on the
worker's result socket (any descriptor of the process is the candidate's), read the next job
from stdin (its nonce too), kill or stall the process. A finalizer run at the settle forged the
next job's result (tests/verifier/test_redteam_round9b.py). So the parent holds the worker to
its protocol (`unexpected_line`: the job's {"started": nonce} first, one result, one settle
reply, nothing else), and an outcome whose evidence is the worker's own word or behaviour (a
failure it reported, a result it forged, a line out of turn, its death, hang or silence at the
settle) is made again in a fresh worker when this one ran earlier jobs (`confirmed`): a
fresh worker has run no candidate before, so what it reports is this candidate's. What the
trusted judge established itself (the trials' outputs it compared, a timed window whose checks
failed: `judged_failure`) is not run again, and the worker's word does not void it: the word is
this candidate's as much as an earlier job's, and a candidate that voided its caught runs would
have a second draw at every check (a re-roll: tests/verifier/test_redteam_round11.py). Only the
parent's own evidence that the worker held an earlier job's residue (`residue`: a line before
this job's start, written before any of its code ran) would void it. An honest batch of passing
jobs confirms nothing and keeps its worker.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from verifier.judge.construct import HOST_ONLY
from verifier.judge.trial_io import on_word
from verifier.judge.trial_pace import timed_finding
from verifier.run.settle import charge_settled

# a worker's outcomes that are no failure of the candidate: "ok" is the judge's to check, a
# reference served to the windows is the baseline's, HOST_ONLY makes the parent run it again
NOT_FAILED = ("ok", "baseline", HOST_ONLY)
PROTOCOL_KEYS = ("ready", "started", "settled")  # lines only the worker's loop writes
BEFORE_START = "a line before the job's start"  # (no code of the job had run yet)
WINDOWS_FAILED = "the timed calls failed the verifier's checks"  # as `verifier.judge.performance`


@dataclass
class RunOutcome:
    """What one job's run produced: the worker's result dict, or why there is none."""

    payload: dict[str, Any] | None
    stage: str = "correctness"  # the last stage the worker reported
    timed_out: bool = False
    failure: str = ""  # one line when payload is None
    flood: bool = False
    wall_s: float = 0.0
    outputs: Any = None  # the raw trial outputs (a sandboxed child's `outputs.pt`)
    rechecked: bool = False  # whether the parent judges the outputs (`verifier.judge.decide`)
    # what the judge's clock measured of the timed windows (`verifier.judge.clock.JudgeClock.result`),
    # for a run whose worker said ok (or whose window failed the judge's checks); None otherwise
    clock: Any = None
    # persistent workers: the judge's answer on the trials (`verifier.judge.trial_judge`), as
    # `verifier.judge.decide.parent_check` asks for it
    referee: Any = None
    # the trials ran on the judge's arena and only the judge compared them (the worker holds
    # no reference: `verifier.run.worker._judged_trials`): a failed check is a wrong answer, not
    # a worker that lied about one
    judge_compared: bool = False
    referee_s: float = 0.0  # seconds the referee's checks of this job took
    # why the task's run cannot fit the device (`verifier.judge.admission`): no run was made, and
    # the verdict is `does_not_fit`, not the candidate's failure
    does_not_fit: str = ""
    # why the task's reference cannot be built under the device context (`verifier.judge.construct`):
    # no run was made, and the parent runs the job again with the host's construction
    host_only: str = ""
    # why this outcome may be an earlier job's doing (its worker ran earlier jobs): the run is
    # made again in a fresh worker (`confirmed`); "" when it stands
    suspect: str = ""
    confirmed: str = ""  # the first run's `suspect`, on the fresh worker's outcome
    # why the worker did not settle after the run, as the parent saw it (`settle_charged`): no
    # finding in the payload says so, the payload's findings are the worker's
    unsettled: str = ""
    # the parent's own evidence that the worker held an earlier job's residue before this job's
    # code ran (`tampered`: a line before the job's start)
    residue: str = ""
    # the own-kernel share as the worker sent it the moment it measured it (`Measured`), before
    # the candidate's code ran again: the verdict's (the result's own is the candidate's to
    # write during its timed calls: tests/verifier/test_redteam_round10.py, share_forged)
    own_share: Any = None
    fastest_us: float | None = None  # the judge's fastest checked window, a failed run's too
    spans: dict[str, float] = field(default_factory=dict)  # `verifier.run.spans`: the profile's


def unexpected_line(msg: dict[str, Any] | None, phase: str, nonce: Any) -> str:
    """Why a line the worker wrote is not one its protocol has at `phase` ("start": the job's
    {"started": nonce}; "job": progress, steps, then the result; "settle": the settle reply);
    "" when it is (None, no line: the caller's timeout or end of file)."""
    if msg is None:
        return ""
    if phase == "start":
        return "" if msg.get("started") == nonce else f"{BEFORE_START} ({_shown(msg)})"
    if any(k in msg for k in PROTOCOL_KEYS if not (phase == "settle" and k == "settled")):
        return f"a line of the worker's loop out of turn ({_shown(msg)})"
    if phase == "settle" and not msg.get("settled"):
        return f"a line that is no settle reply while the worker settled ({_shown(msg)})"
    return ""


class Measured:
    """The figures a job's worker sent as it measured them (its {"measured": ...} line,
    `verifier.run.job_result.JobResult.measured`): the parent's copy, which the verdict takes."""

    def __init__(self) -> None:
        self.fields: dict[str, Any] | None = None

    def take(self, msg: dict[str, Any] | None) -> str:
        """Keep `msg`'s figures when it is the job's measurement line; why not when it is a
        second one (the harness sends one: the other is the candidate's); "" otherwise."""
        if msg is None or "measured" not in msg:
            return ""
        if self.fields is not None or not isinstance(msg["measured"], dict):
            return f"a second or malformed measurement line ({_shown(msg)})"
        self.fields = msg["measured"]
        return ""

    def get(self, key: str) -> Any:
        return (self.fields or {}).get(key)


def _shown(msg: dict[str, Any]) -> str:
    return ", ".join(sorted(str(k) for k in msg)[:6])


PROTOCOL = "the worker wrote a line its protocol does not have: "


def tampered(out: RunOutcome, why: str, earlier_jobs: int, nonce: Any,
             said: str = PROTOCOL) -> RunOutcome:
    """A line out of the worker's protocol (`unexpected_line`; the worker is stopped), or a
    settle whose ready snapshot is not the one the parent holds (`verifier.run.seal`; `said`
    ""): with earlier jobs in its worker it may be theirs, and the run is made again
    (`suspect`; a line before the job's start is theirs: `residue`); in a fresh worker only
    this job's code ran, and it wrote the line: a cheat."""
    residue = why.startswith(BEFORE_START)
    why = said + why
    if earlier_jobs:
        out.suspect = why
        out.residue = why if residue else ""
        return out
    out.payload = {"nonce": nonce, "outcome": "cheat", "stage": out.stage, "error": why,
                   "worker_pid": (out.payload or {}).get("worker_pid"),
                   "findings": [{"rule": "forged_result", "severity": "error", "line": None,
                                 "message": why}]}
    return out


def settle_charged(out: RunOutcome, reply: dict[str, Any] | None, why: str) -> bool:
    """What the worker found as it settled (its reply; None when there was none: `why`) charged
    to the job (`verifier.run.settle.charge_settled`), and a settle that did not come recorded
    by the parent itself (`unsettled`); True when the worker must go."""
    if reply is None or not reply.get("settled"):
        out.unsettled = f"the worker did not settle after the run ({why})"
    return charge_settled(out.payload or {}, reply, why)


def reported_failure(out: RunOutcome, nonce: Any) -> str:
    """Why `out` rests on what the worker process said or did (a failure it reported, a result
    not the harness's, its death, hang or flood, no settle as the parent saw it: `unsettled`):
    "" when the judge's checks of its "ok" decide it."""
    p = out.payload
    if p is None:
        return f"the worker failed ({out.failure[:200]})"
    if p.get("nonce") != nonce:
        return "the result was not the harness's (its nonce)"
    if p.get("outcome") not in NOT_FAILED:
        return f"the worker reported {p.get('outcome')} ({str(p.get('error') or '')[:200]})"
    return _report_failed(out) or out.unsettled


def _report_failed(out: RunOutcome) -> str:
    """Why the judge failed an "ok" run's trials on the form of its report alone (`on_word`:
    the worker's word, not a slot it compared); "" otherwise."""
    ok, why = _trials_answer(out) or (None, "")
    return f"its trials' report failed the judge's reading ({why[:200]})" \
        if ok is False and on_word(why) else ""


def _trials_answer(out: RunOutcome) -> tuple[Any, str] | None:
    """The judge's answer on the run's trials, (ok, why): checked at the clock's "t"
    (`trial_pace.trials_checked`), else as the run ended (`GpuRunner._judged_here`); None
    where it made none (or the referee itself failed: nothing was established)."""
    early = out.clock.get("trials") if isinstance(out.clock, dict) else None
    if early:
        return early[0], str(early[1])
    if not out.judge_compared or out.referee is None:
        return None
    try:
        ok, why = out.referee("run", {})  # the answer already made (no argument is read)
    except RuntimeError:
        return None
    return ok, str(why)


def judged_failure(out: RunOutcome) -> str:
    """Why the trusted judge itself failed this run ("" when it did not): a timed window whose
    outputs or inputs failed its checks (the clock's `failed_check`), or trials it compared
    (`judge_compared`) and found wrong; its answer as `GpuRunner._judged_here` recorded it.
    A report of the wrong form whose slots passed (or could not be read without it) is the
    worker's word, which an earlier job's code may have garbled (`on_word`)."""
    failed = out.clock.get("failed_check") if isinstance(out.clock, dict) else ""
    if failed:
        return f"a timed window failed the judge's checks ({str(failed)[:200]})"
    ok, why = _trials_answer(out) or (None, "")
    return f"the judge compared its trials ({why[:200]})" if ok is False and not on_word(why) \
        else ""


def window_failed(out: RunOutcome, timed: dict[str, Any] | None, nonce: Any) -> RunOutcome:
    """A run whose timed window failed the judge's checks (`timed`: its clock's result) and that
    then ended without an "ok" (a death, hang, line out of turn, or a failure the worker
    reported: the windows go on after a failed one): that failure is its verdict, a cheat; so
    is trials that failed the judge's check at "t" (`incorrect`: `_trials_failed`)."""
    failed = str((timed or {}).get("failed_check") or "") if out.clock is None else ""
    early = (timed or {}).get("trials") if out.clock is None else None
    if not failed and early and early[0] is False:
        return _trials_failed(out, timed, nonce, early)
    if failed:
        p = out.payload if out.payload is not None and out.payload.get("nonce") == nonce else {}
        out.clock, out.timed_out = timed, False
        out.payload = {**p, "nonce": nonce, "outcome": "cheat", "stage": "performance",
                       "error": f"{WINDOWS_FAILED}: {failed}",
                       "findings": [*(p.get("findings") or ()), {
                           "rule": "judge_clock", "severity": "error", "line": None,
                           "message": failed}]}
    return out


def _trials_failed(out: RunOutcome, timed: dict[str, Any] | None, nonce: Any,
                   early: list[Any]) -> RunOutcome:
    """A run whose trials failed the judge's check at the clock's "t" (no window was served)
    and that then ended without an "ok": `incorrect` all the same (a cheat the worker reported
    stays one): the judge's answer is the trials' verdict, whatever the run did next."""
    p = out.payload if out.payload is not None and out.payload.get("nonce") == nonce else {}
    if p.get("outcome") == "cheat":
        return out
    out.clock, out.timed_out, out.judge_compared = timed, False, True
    out.payload = {**p, **dict(early[2] or {}), "nonce": nonce, "outcome": "incorrect",
                   "stage": "correctness", "error": str(early[1])}
    return out


def run_ended(out: RunOutcome, clock: Any, nonce: Any, earlier: int) -> RunOutcome:
    """A persistent worker's run as it ended (`GpuWorkerProcess.run`): with earlier jobs in its
    worker, an outcome that rests on the worker's word is `suspect`; a window that failed the
    judge's checks before it ended is the verdict all the same (`window_failed`)."""
    if earlier and not out.suspect:
        out.suspect = reported_failure(out, nonce)
    timed = clock.result() if clock is not None and out.clock is None else None
    out.fastest_us = (timed or out.clock or {}).get("fastest_us")
    return window_failed(out, timed, nonce)


def _note(out: RunOutcome, rule: str, note: str) -> None:
    if out.payload is not None:
        out.payload.setdefault("findings", []).append(
            {"rule": rule, "severity": "info", "line": None, "message": note[:600]})
    else:
        out.failure += f" ({note[:300]})"


RETIMED = ("the judge's windows beat its traced trials past its bound (perhaps the host's "
           "load in the trials)")


def retimed(out: RunOutcome) -> RunOutcome:
    """`out`, to be made again in a fresh worker (`confirmed`) when the judge's windows beat
    its traced trials (`verifier.judge.trial_pace`): a trial caught by the host's load (a
    2-core host at load 30 timed honest 400 us trials at 4-16 ms) must not make an honest
    kernel a cheat; a run that switches kernels does it again, and that stands."""
    if not out.suspect and timed_finding((out.clock or {}).get("figures") or {}):
        out.suspect = RETIMED
    return out


def confirmed(run: Callable[[], RunOutcome], fresh_worker: Callable[[], None]) -> RunOutcome:
    """`run` the job; an outcome that may be an earlier job's doing (`suspect`) is made again
    after `fresh_worker` put a worker that ran no job in place, and that run's outcome stands
    (a failure confirmed, or the first run's voided); no third run. A failure the judge
    established (`judged_failure`) stands as it is, unless the parent found an earlier job's
    `residue` in the worker."""
    out = run()
    judged = judged_failure(out) if out.suspect and not out.residue else ""
    if judged:
        _note(out, "judged_failure_stands", f"not run again in a fresh worker: {judged}; what "
              f"its worker said or did after earlier jobs does not void it ({out.suspect})")
        out.suspect = ""
    if not out.suspect:
        return out
    fresh_worker()
    again = run()
    again.wall_s += out.wall_s
    again.confirmed = out.suspect
    why = out.suspect if out.suspect == RETIMED else \
        f"its first worker had run earlier jobs, and {out.suspect}"
    _note(again, "confirmed_fresh", f"run again in a fresh worker: {why}")
    return held_to_first(again, None if out.residue else out.fastest_us)


def held_to_first(again: RunOutcome, first_us: float | None) -> RunOutcome:
    """The second run's runtime no faster than the fastest window the judge checked in the
    first (`first_us`): a run that dies once its windows are slow must not get a second timing
    draw (tests/verifier/test_redteam_round14.py). None: the first run left no checked window,
    or the parent found an earlier job's residue in its worker (none of that run stands)."""
    figures = (again.clock or {}).get("figures") or {}
    runtime = figures.get("runtime_us")
    if first_us is None or not runtime or runtime >= first_us:
        return again
    figures.update(runtime_us=first_us, fresh_runtime_us=runtime)
    _note(again, "held_to_first_windows", f"runtime held to {first_us:.1f} us a call, the "
          f"fastest window the judge checked in its first run (the fresh run's: {runtime:.1f} us)")
    return again
