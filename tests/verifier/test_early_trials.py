"""The trials checked at the clock's "t" (`verifier.judge.trial_pace.trials_checked`): the worker
sends its trials' report with "t", the judge checks the trials then, and a run whose trials
failed is served no timed window (two in five of KernelBench's candidates are wrong: each paid
the calibration, the windows and their checks, a GB-sized miss an exact scan and an fp64 second
opinion a window, for a verdict its trials had already made). Its failure stands whatever the
run does next (`verifier.run.outcome`)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import torch
from verifier_cases import SCALE_TASK, cpu_loop_jobs  # noqa: E402

from verifier.judge import clock_serve
from verifier.judge.arena import Arena, fill, views
from verifier.judge.clock import JudgeClock
from verifier.judge.window_judge import WindowJudge
from verifier.run.outcome import RunOutcome, judged_failure, run_ended

TOL = (1e-4, 1e-4, 1e-2, 1e-2)
REPORT = {"trial_report": {"values": [[[], [], []]]}, "variants_checked": None}


class _Trials:
    """A trial judge's `check` as the clock calls it: what it was given, and its answer."""

    def __init__(self, ok: bool) -> None:
        self.ok, self.seen = ok, []  # type: list[Any]

    def check(self, report: Any, checked: Any) -> tuple[bool, str, dict[str, float]]:
        self.seen.append((report, checked))
        return self.ok, "" if self.ok else "trial 2: wrong", {"max_abs_diff": 0.5}


def _serve(tmp_path: Path, trials: Any, head: bytes, body: bytes = b"",
           forward: Any = None) -> tuple[dict[str, Any], dict[str, int], list[bytes]]:
    """A clock over a window judge whose `trials` is `trials`; a worker thread that says `head`
    (its "t" line) and `body`, then serves what it is told: (the clock's result, the worker's
    calls, the orders it read)."""
    judge = WindowJudge(SCALE_TASK, 0, TOL, 16 << 20, path=str(tmp_path / "arena.bin"))
    judge.trials = trials
    spec = {**judge.spec, "path": str(tmp_path / "arena.bin")}
    jc = JudgeClock(judge, workdir=tmp_path, wait_s=20.0)
    calls, orders = {"n": 0}, []  # type: dict[str, int], list[bytes]

    def work(x: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        return x * 3.0 + 1.0

    def target() -> None:
        arena = Arena.attach(spec["path"], spec["nbytes"], "cpu")
        wfd = os.open(tmp_path / clock_serve.REQ, os.O_WRONLY)
        rfd = os.open(tmp_path / clock_serve.GO, os.O_RDONLY)
        try:
            sets = [views(arena, layout) for layout in spec["sets"]]
            slots = [views(arena, layout) for layout in spec["outs"]]
            clock_serve.write_all(wfd, head + body)
            while True:
                line = clock_serve.read_line(rfd).encode()
                orders.append(line)
                if line == b"e\n":
                    return
                n = int(line.split()[1])
                for i in range(n):
                    fill(slots[i], (forward or work)(*sets[i % len(sets)]))
                os.write(wfd, b"d\n")
        except OSError:
            return
        finally:
            os.close(wfd)
            os.close(rfd)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout=60)
    result = jc.result()
    judge.close()
    assert not t.is_alive()
    return result, calls, orders


def _report(obj: Any = REPORT) -> tuple[bytes, bytes]:
    body = json.dumps(obj).encode()
    return f"t {len(body)}\n".encode(), body


def test_failed_trials_are_served_no_window(tmp_path: Path) -> None:
    """Before (main at 264aee6): the trials were checked once the run had served every window,
    so a wrong run was calibrated, timed and checked window by window first."""
    trials = _Trials(False)
    result, calls, orders = _serve(tmp_path, trials, *_report())
    assert orders == [b"e\n"] and calls["n"] == 0, (orders, calls)
    assert trials.seen == [(REPORT["trial_report"], None)], trials.seen
    assert result["trials"][:3] == [False, "trial 2: wrong", {"max_abs_diff": 0.5}], result
    assert result["figures"] == {} and result["failure"] == "", result


def test_passing_trials_are_timed_as_before(tmp_path: Path) -> None:
    trials = _Trials(True)
    result, calls, orders = _serve(tmp_path, trials, *_report())
    assert trials.seen and result["trials"][0] is True, result
    assert result["figures"]["runtime_us"] > 0 and calls["n"] > 0, (result, calls)
    assert orders[-1] == b"e\n" and len(orders) > 5, orders


def test_a_plain_t_is_checked_as_the_run_ends(tmp_path: Path) -> None:
    """No report with "t" (a seeded run, the baseline served to the windows): nothing is
    checked at "t", and the windows are served."""
    trials = _Trials(False)
    result, calls, _ = _serve(tmp_path, trials, b"t\n")
    assert trials.seen == [] and result["trials"] is None, result
    assert result["figures"]["runtime_us"] > 0 and calls["n"] > 0


def test_an_oversized_or_odd_report_is_a_failure_not_a_check(tmp_path: Path) -> None:
    trials = _Trials(True)
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    result, calls, orders = _serve(tmp_path / "a", trials, b"t 999999999\n")
    assert "a trial report of '999999999' bytes" in result["failure"], result
    assert trials.seen == [] and calls["n"] == 0 and orders == [b"e\n"], (orders, calls)
    result, _, _ = _serve(tmp_path / "b", _Trials(True), b"t -4\n")
    assert "a trial report of '-4' bytes" in result["failure"], result


def test_a_report_that_is_not_json_is_checked_as_missing(tmp_path: Path) -> None:
    """The harness sends JSON; anything else is checked as no report at all (the trial judge
    fails it: `values_of_report`)."""
    trials = _Trials(False)
    result, _, orders = _serve(tmp_path, trials, b"t 5\n", b"{nope")
    assert trials.seen == [(None, None)] and orders == [b"e\n"], (trials.seen, orders)
    assert result["trials"][0] is False


def test_a_run_that_dies_after_failed_trials_is_incorrect() -> None:
    """A run told at once that its trials failed (no window) and that then dies, hangs or
    reports its own failure: the judge's answer is its verdict (`incorrect`), not the death
    (a `runtime_error`, or a run made again in a fresh worker after earlier jobs)."""
    timed = {"figures": {}, "failure": "", "judge_error": "", "failed_check": "",
             "trials": [False, "trial 2: wrong", {"max_abs_diff": 0.5}, 0.01]}

    class _Clock:
        def result(self) -> dict[str, Any]:
            return timed

    for payload in (None, {"nonce": "n1", "outcome": "runtime_error", "error": "boom"}):
        out = run_ended(RunOutcome(payload, failure="the worker died"), _Clock(), "n1", 3)
        assert out.payload["outcome"] == "incorrect", out.payload
        assert out.payload["error"] == "trial 2: wrong" and out.payload["max_abs_diff"] == 0.5
        assert judged_failure(out) == "the judge compared its trials (trial 2: wrong)"
    cheat = {"nonce": "n1", "outcome": "cheat", "error": "tampered"}
    out = run_ended(RunOutcome(dict(cheat)), _Clock(), "n1", 0)
    assert out.payload["outcome"] == "cheat", out.payload  # the worker's own finding stays


# numpy's ReLU and numpy's identity (no torch op for the fallback trace, nothing to compile)
HONEST = """import torch


class ModelNew(torch.nn.Module):
    def forward(self, x):
        import numpy as np
        return torch.from_numpy(np.maximum(x.numpy(), 0))
"""
WRONG = HONEST.replace("np.maximum(x.numpy(), 0)", "x.numpy().copy()")  # relu(x) is not x
# told at once that its trials failed (the clock's "e" right after "t"), it dies: a void run
# would be made again in a fresh worker (a second draw) after an earlier job
DIES = WRONG.replace("import torch\n", """import os as _os

import torch
import verifier.judge.clock_serve as _cs

_read = _cs.read_line


def _told(fd, size=1):
    line = _read(fd, size)
    if line == "e\\n" and not _told.windows:
        _os._exit(7)
    _told.windows = _told.windows or line.startswith(("w", "s"))
    return line


_told.windows = False
_cs.read_line = _told
""", 1)


def test_wrong_runs_on_the_worker_loop_skip_the_windows() -> None:
    """Through the persistent worker's loop (the GPU's path; the judge in this process): an
    honest run is timed, a wrong one is checked at "t" and served no window, and one that dies
    when it learns so is `incorrect`, not run again in a fresh worker."""
    began = time.monotonic()
    outs, confirmations = cpu_loop_jobs([HONEST, WRONG, DIES], "early")
    honest, wrong, dies = outs
    assert honest.clock["trials"][0] is True and honest.clock["figures"]["runtime_us"] > 0
    assert wrong.clock["trials"][0] is False and wrong.clock["figures"] == {}, wrong.clock
    assert wrong.payload["outcome"] == "ok" and wrong.referee("run", {})[0] is False
    assert dies.payload["outcome"] == "incorrect", (dies.payload, dies.failure)
    assert "checked by the verifier itself" in dies.payload["error"], dies.payload
    assert confirmations == 0, confirmations
    assert time.monotonic() - began < 120


def test_a_report_of_the_wrong_form_after_earlier_jobs_is_made_again() -> None:
    """Trials that failed at "t" by the form of the report alone (their slots passed: `on_word`)
    rest on the worker's word, which an earlier job's code may have garbled: after earlier jobs
    the run is made again in a fresh worker. A failure of the slots stands (no second draw)."""
    from verifier.run.outcome import confirmed

    for why, again in (("the worker's trial report: no trial report", 1),
                       ("trial 1, checked by the verifier itself: output 0: differ", 0)):
        timed = {"figures": {}, "failure": "", "judge_error": "", "failed_check": "",
                 "trials": [False, why, {}, 0.01, None]}

        for payload in ({"nonce": "n1", "outcome": "ok"},  # told "e", it says ok: the
                        {"nonce": "n1", "outcome": "incorrect", "error": why}):  # or not
            runs: list[int] = []

            def run(payload: dict[str, Any] = payload, runs: list[int] = runs,
                    timed: dict[str, Any] = timed) -> RunOutcome:
                runs.append(1)  # the run as `GpuRunner._judged_here` leaves it
                judged = RunOutcome(dict(payload), clock=timed)
                judged.judge_compared = True
                return run_ended(judged, None, "n1", 2)

            out = confirmed(run, lambda: None)
            assert len(runs) == 1 + again, (why, payload, runs)
            assert (judged_failure(out) == "") is bool(again)
            notes = [f["rule"] for f in out.payload.get("findings") or ()]
            assert ("confirmed_fresh" in notes) is bool(again), notes
