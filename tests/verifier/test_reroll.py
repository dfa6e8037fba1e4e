"""The re-roll (issue 28, red-team round 11): a failure the trusted judge established is not
voided by the candidate's own word in a persistent worker that ran earlier jobs
(`verifier.run.outcome.judged_failure`, `confirmed`), and the judge's clock serves the planned
windows after a failed one, so a caught worker cannot tell it was caught
(`verifier.judge.clock.JudgeClock.failed_check`).

A window cheat that learnt it was caught (the clock ended the windows with "e" right after the
failed check) voided that run with a line out of the worker's protocol or a forged "did not
settle" finding: its run was made again in a fresh worker, where it drew again. Caught with
probability q, it passed with 1 - q^2. The unit tests pin each rule; the end-to-end test runs
two such cheats on the persistent worker's cpu loop (`GpuRunner`, a worker that ran an earlier
job). An honest failure after earlier jobs is still made again in a fresh worker
(tests/verifier/test_fresh_confirm.py, test_redteam_round9b.py)."""

from __future__ import annotations

import os
import select
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from redteam_round7_cases import NUMPY_RELU  # noqa: E402
from test_clock import _judge_run  # noqa: E402
from verifier_cases import cpu_loop_jobs  # noqa: E402

from verifier.judge.clock import JudgeClock  # noqa: E402
from verifier.run.outcome import (  # noqa: E402
    RunOutcome,
    confirmed,
    judged_failure,
    reported_failure,
    run_ended,
    settle_charged,
    tampered,
    window_failed,
)

TOL = (1e-4, 1e-4, 1e-2, 1e-2)
WRONG = "the output of a timed call was wrong: call 1 of 1: output 0: differs beyond atol"


# --- the clock: the planned windows after a failed one ----------------------------------------
class _Judge:
    """A window judge whose check fails the `fail_at`-th window with calls (0: none fails)."""

    copy_s, sets, out_bytes, set_bytes = 0.0, 256, 4, 4

    def __init__(self, fail_at: int) -> None:
        self.fail_at, self.checked = fail_at, 0

    def fill(self, n: int) -> None:
        return None

    def check(self, n: int, deep: bool = False) -> str:
        self.checked += 1
        return WRONG if self.checked == self.fail_at else ""


class _PlannedClock(JudgeClock):
    """The judge's clock with windows that take 1 ms a call (round trip 0.1 ms): the orders it
    gives are recorded; what the worker receives on the pipe is then only the end ("e")."""

    def __init__(self, judge: _Judge, fds: tuple[int, int]) -> None:
        self.orders: list[int] = []
        super().__init__(judge, fds=fds, wait_s=5.0)

    def _window(self, n: int) -> float:
        self.orders.append(n)
        return 1e-3 * n if n else 1e-4


def _planned(fail_at: int, judge: _Judge | None = None
             ) -> tuple[list[int], bytes, dict[str, Any]]:
    """(the window orders, all the worker received, the result) of one clock's windows."""
    req_r, req_w = os.pipe()
    go_r, go_w = os.pipe()
    os.set_blocking(req_r, False)
    jc = _PlannedClock(judge or _Judge(fail_at), (req_r, go_w))
    try:
        os.write(req_w, b"t\n")
        got = b""
        deadline = time.monotonic() + 20
        while not got.endswith(b"\n") and time.monotonic() < deadline:
            if select.select([go_r], [], [], 0.5)[0]:
                got += os.read(go_r, 64)
        return jc.orders, got, jc.result()
    finally:
        for fd in (req_r, req_w, go_r, go_w):
            os.close(fd)


def test_the_clock_serves_the_planned_windows_after_a_failed_one() -> None:
    """Before (main at 258f195): the second window with calls failed its check and the clock
    ended the windows at once (orders 0 x5, 1, 2, then "e"): the worker knew it was caught, and
    when. Now the windows after it are the plan of a run whose checks all pass (the same orders,
    one "e" at the end), and the first failed check is the windows' failure, with no figures."""
    passed, end_passed, res_passed = _planned(0)
    failed, end_failed, res_failed = _planned(2)
    assert passed == [0] * 5 + [1, 2, 4, 8, 20, 20, 20], passed  # 1 ms a call: 20 for 20 ms
    assert failed == passed and end_failed == end_passed == b"e\n", (failed, end_failed)
    assert res_passed["failure"] == "" and res_passed["figures"]["calls"] == 20, res_passed
    assert res_failed["failed_check"] == res_failed["failure"] == WRONG, res_failed
    assert res_failed["figures"] == {}, res_failed


def test_no_window_is_checked_after_a_failed_one() -> None:
    """The windows after a failed check are served (the plan's orders, above) but not checked:
    the verdict is made, and each check is a reference forward and a comparison (on a GB-sized
    wrong output the exact scan and the fp64 second opinion, ~1 s a window on an H100).
    Before: every window of the plan was checked (`checked` == the windows with calls)."""
    passing, failing = _Judge(0), _Judge(2)
    orders, _, _ = _planned(0, passing)
    again, _, res = _planned(2, failing)
    assert again == orders and passing.checked == sum(1 for n in orders if n), (orders, passing)
    assert failing.checked == 2 and res["failed_check"] == WRONG, (failing.checked, res)


def test_a_caught_worker_is_served_more_windows(tmp_path: Path) -> None:
    """The clock's protocol as the worker speaks it (`clock_serve.serve_windows`): its first
    timed call skips the work (the judge's check of that window fails). Before: no call came
    after it (the windows ended with "e" right after the check). Now the planned windows
    follow it, and the judge's failure stands."""
    calls = {"skipped": 0, "after": 0}

    def forward(x: torch.Tensor) -> torch.Tensor:
        if not calls["skipped"]:
            calls["skipped"] = 1
            return torch.zeros_like(x)
        calls["after"] += 1
        return x * 3.0 + 1.0

    res = _judge_run(tmp_path, forward)
    assert calls["after"] >= 3, calls  # at least the calibration's next window and WINDOWS
    assert res["failure"].startswith("the output of a timed call was wrong"), res
    assert res["failed_check"] == res["failure"] and res["figures"] == {}, res


# --- the parent: a judged failure stands ---------------------------------------------------
def _judged_wrong(nonce: str = "n1") -> RunOutcome:
    out = RunOutcome({"nonce": nonce, "outcome": "ok", "findings": []}, rechecked=True,
                     judge_compared=True)
    out.referee = lambda op, args: (False, "trial 1: output 0: differs beyond atol")
    return out


def test_the_settles_failure_is_the_parents_record() -> None:
    """No settle reply: the parent records it (`unsettled`), and a run resting on it is the
    worker's word (`reported_failure`). A "did not settle" finding the candidate wrote into its
    own result is no such record: before, the parent searched the payload's findings for it."""
    out = RunOutcome({"nonce": "n1", "outcome": "ok", "findings": []})
    assert settle_charged(out, None, "no reply within 30 s")  # the worker goes
    assert out.unsettled.startswith("the worker did not settle") and "30 s" in out.unsettled
    assert reported_failure(out, "n1") == out.unsettled
    assert any(f["rule"] == "worker_replaced" for f in out.payload["findings"])  # charged
    forged = RunOutcome({"nonce": "n1", "outcome": "ok", "findings": [{
        "rule": "worker_replaced", "severity": "warning", "line": None,
        "message": "the worker did not settle after the run (forged): it was replaced"}]})
    assert not settle_charged(forged, {"settled": True, "outcome": "ok", "findings": []}, "")
    assert forged.unsettled == "" and reported_failure(forged, "n1") == ""


def test_what_the_judge_established() -> None:
    """`judged_failure`: a window that failed the clock's checks, or trials the judge compared
    and found wrong; not a referee that failed, nor a failure only the worker reported."""
    assert "differs beyond atol" in judged_failure(_judged_wrong())
    window = RunOutcome({"nonce": "n1", "outcome": "ok"}, clock={
        "figures": {}, "failure": WRONG, "judge_error": "", "failed_check": WRONG})
    assert WRONG in judged_failure(window)
    hung = RunOutcome({"nonce": "n1", "outcome": "ok"}, clock={
        "figures": {}, "failure": "the worker did not finish a timing window in time",
        "judge_error": "", "failed_check": ""})
    assert judged_failure(hung) == ""  # the worker's behaviour, not a check of its outputs
    broken = _judged_wrong()

    def failed_referee(op: str, args: dict[str, Any]) -> tuple[bool, str]:
        raise RuntimeError("the referee died")

    broken.referee = failed_referee
    assert judged_failure(broken) == ""
    assert judged_failure(RunOutcome({"nonce": "n1", "outcome": "runtime_error"})) == ""


def test_an_earlier_jobs_residue_the_parent_found_still_voids_a_judged_failure() -> None:
    """A line before the job's start (written before any of its code ran) is the parent's own
    evidence of an earlier job's residue (`residue`): a judged failure with it is made again in
    a fresh worker. A line out of turn later in the job is not (the candidate's as much)."""
    for line, again in (("a line before the job's start (nonce, outcome)", True),
                        ("a line of the worker's loop out of turn (settled)", False)):
        runs = iter([tampered(_judged_wrong(), line, 2, "n1"),
                     RunOutcome({"nonce": "n1", "outcome": "ok", "findings": []})])
        fresh: list[int] = []
        got = confirmed(runs.__next__, lambda fresh=fresh: fresh.append(1))
        assert bool(fresh) == again and bool(got.confirmed) == again, (line, got)
        if not again:
            assert got.referee is not None and not got.referee("run", {})[0]
            assert any(f["rule"] == "judged_failure_stands" for f in got.payload["findings"])


class _Ended:
    """A stopped clock as `GpuWorkerProcess.run` hands it to `run_ended`."""

    def __init__(self, failed_check: str) -> None:
        self.failed_check = failed_check

    def result(self) -> dict[str, Any]:
        return {"figures": {}, "failure": self.failed_check or "the timing windows failed: "
                "the worker closed the clock pipe", "judge_error": "",
                "failed_check": self.failed_check}


def test_a_run_that_ends_after_a_failed_window_is_the_judges_failure() -> None:
    """A worker that dies (or hangs, or writes a line out of turn) after a window failed the
    judge's checks: that failure is the run's verdict (a cheat, not run again). An honest
    worker that died with no failed window is the worker's word: made again in a fresh one."""
    died = RunOutcome(None, "performance", True, "worker died with SIGKILL")
    out = run_ended(died, _Ended(WRONG), "n1", earlier=2)
    assert out.payload is not None and out.payload["outcome"] == "cheat", out
    assert WRONG in out.payload["error"] and not out.timed_out
    assert any(f["rule"] == "judge_clock" for f in out.payload["findings"])
    assert confirmed(lambda: out, lambda: pytest.fail("run again")) is out and not out.suspect
    honest = run_ended(RunOutcome(None, "performance", False, "worker died with SIGKILL"),
                       _Ended(""), "n1", earlier=2)
    assert honest.payload is None and honest.suspect.startswith("the worker failed"), honest
    again = RunOutcome({"nonce": "n1", "outcome": "ok", "findings": []})
    runs = iter([honest, again])
    assert confirmed(lambda: next(runs), lambda: None) is again and again.confirmed
    # a sandboxed run (`SandboxRunner`, no earlier jobs) whose worker reported a failure after
    # the failed window: the judge's failure is the verdict; an "ok" keeps its clock's result
    raised = window_failed(RunOutcome({"nonce": "n1", "outcome": "runtime_error", "error": "x",
                                       "findings": []}), _Ended(WRONG).result(), "n1")
    assert raised.payload is not None and raised.payload["outcome"] == "cheat", raised
    timed = {"figures": {}, "failure": WRONG, "judge_error": "", "failed_check": WRONG}
    ok = RunOutcome({"nonce": "n1", "outcome": "ok"}, clock=timed)
    assert window_failed(ok, timed, "n1").payload == {"nonce": "n1", "outcome": "ok"}


# --- end to end: the persistent worker's cpu loop -------------------------------------------
# A numpy ReLU whose first timed call skips the work (the judge's check of that window fails);
# as the worker settles the job, a finalizer writes a line out of the worker's protocol on its
# result socket (its fd is the worker's argv) when `VOID` says so: "caught" (no timed call came
# after the failed one: the windows ended at once), or always
VOIDER = '''import os
import sys

import torch

SEEN = {"caught": 0, "after": 0}
VOID = "%s"


def _timed():
    f = sys._getframe()
    while f is not None and f.f_code.co_name != "serve_windows":
        f = f.f_back
    return f is not None


class AtSettle:
    def __del__(self):
        f = sys._getframe()
        while f is not None and f.f_code.co_name != "_settle":
            f = f.f_back
        if f is None:  # collected in the job itself: wait for the settle
            again = AtSettle()
            again.me = again
            return
        if VOID == "always" or (SEEN["caught"] and not SEEN["after"]):
            os.write(int(sys.argv[1]), b'{"started": "void"}\\n')


class ModelNew(torch.nn.Module):
    def forward(self, x):
        import numpy as np
        if _timed():
            if not SEEN["caught"]:
                SEEN["caught"] = 1
                return torch.zeros_like(x)
            SEEN["after"] += 1
        return torch.from_numpy(np.maximum(x.numpy(), 0))

    def __del__(self):
        first = AtSettle()
        first.me = first
'''


def test_a_caught_window_cheat_in_a_used_worker_cannot_re_roll() -> None:
    """One `GpuRunner` (cpu loop, one worker): an honest job, then a window cheat that voids
    its run only when the windows end right after its failed one, then one that always voids.
    Before (main at 258f195): the first cheat saw the windows end at once and voided its run
    (a line out of turn at its settle, after an earlier job): it was made again in a fresh
    worker (`confirmed`, one confirmation each). Now the first is served the planned windows
    (no void: its run stands, the judge's failure), and the second's line does not void the
    judge's failure: no run is made again, and the verdicts are the windows' failures."""
    outs, confirmations = cpu_loop_jobs([NUMPY_RELU, VOIDER % "caught", VOIDER % "always"],
                                        "rr")
    honest, caught, always = outs
    assert (honest.clock or {}).get("failure") == "" and honest.clock["figures"], honest.clock
    for out in (caught, always):
        assert out.payload is not None and not out.confirmed, (out.payload, out.confirmed)
        assert str((out.clock or {}).get("failure")).startswith(
            "the output of a timed call was wrong"), out.clock
        assert out.referee is not None and out.referee("run", {})[0]  # its trials were right
    stands = [f for f in always.payload["findings"] if f["rule"] == "judged_failure_stands"]
    assert stands and "out of turn" in stands[0]["message"], always.payload["findings"]
    assert not any(f["rule"] == "judged_failure_stands" for f in caught.payload["findings"])
    assert confirmations == 0
