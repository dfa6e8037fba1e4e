"""A failure a persistent worker reports after earlier jobs is made again in a fresh worker
(`verifier.run.outcome.confirmed`, `GpuRunner.run`), end to end through `verify_batch` on the
persistent worker's cpu loop: an honest failure is the same failure there (no false pass), what
the judge established itself (an output it compared) is not run again, and an honest batch of
passing jobs confirms nothing and keeps its worker. The forgers this answers are in
tests/verifier/test_redteam_round9b.py."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from verifier.api import verify_batch
from verifier.backends.cpu import CpuBackend
from verifier.protocol import CORRECT_STATUSES, VerifyOptions, VerifyRequest
from verifier.run.outcome import RunOutcome, confirmed, unexpected_line

sys.path.insert(0, str(Path(__file__).parent))
from verifier_cases import RELU_LOOP, RELU_TASK, relu_candidate, relu_ok  # noqa: E402

CACHE = Path.home() / ".cache" / "kernelsynth-tests" / "verifier-builds"  # shared by the tests
CONFIRMED = "runs confirmed in a fresh worker"
OK = relu_ok()
# an honest bug: a view the input's size does not allow (torch raises in forward)
RAISER = relu_candidate(RELU_LOOP.format(fn="relu_fwd", pragma="#pragma omp parallel for"),
                        forward="return ext.relu_fwd(x.view(-1, 3))")
# a wrong answer: negative inputs give 1, not 0 (only the judge can tell)
WRONG = relu_ok().replace("in[i] : 0.f", "in[i] : 1.f")


def _batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sources: list[str]
           ) -> tuple[list[Any], dict[str, dict], dict[str, Any]]:
    """(verdicts, timings, stats) of one batch, in order, on one persistent cpu worker."""
    monkeypatch.setattr(CpuBackend, "persistent_worker", True)
    assert RAISER != OK and WRONG != OK
    opts = VerifyOptions(backend="cpu", workers=1, compile_workers=1, run_timeout_s=60.0,
                         trials=2, perf_trials=2, perf_warmup=1, standby_workers=1,
                         baseline_cache_dir=str(tmp_path / "bl"),
                         build_cache_dir=str(CACHE))
    reqs = [VerifyRequest(f"c{i}", "relu", RELU_TASK, f"```python\n{src}\n```", "cpu")
            for i, src in enumerate(sources)]
    timings: dict[str, dict] = {}
    stats: dict[str, Any] = {}
    verdicts = verify_batch(reqs, opts, timings=timings, stats=stats)
    return verdicts, timings, stats


def _confirmations(v: Any) -> list[str]:
    return [f["message"] for f in v.findings if f["rule"] == "confirmed_fresh"]


def test_an_honest_failure_is_the_same_failure_in_a_fresh_worker(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two honest passing jobs, then an honest candidate whose forward raises (a runtime_error
    its worker reports, after earlier jobs: made again in a fresh worker), then one whose output
    is wrong (the judge compared it: not run again), then a passing one. The raiser's verdict is
    the fresh worker's and the same failure (no false pass); one run was confirmed in the batch."""
    verdicts, timings, stats = _batch(tmp_path, monkeypatch,
                                      [OK, OK, RAISER, WRONG, OK])
    ok0, ok1, raiser, wrong, ok2 = verdicts
    for v in (ok0, ok1, ok2):
        assert v.status in CORRECT_STATUSES and not _confirmations(v), (v.status, v.error)
    assert raiser.status == "runtime_error", (raiser.status, raiser.error)
    assert "is invalid for input of size" in raiser.error, raiser.error
    assert any("reported runtime_error" in m for m in _confirmations(raiser)), raiser.findings
    assert wrong.status == "incorrect" and not _confirmations(wrong), (wrong.status, wrong.error)
    assert stats["counters"][CONFIRMED] == 1, stats["counters"]
    pid = {c: timings[c]["worker_pid"] for c in timings}
    assert pid["c0"] == pid["c1"], pid  # passing jobs keep their worker
    assert pid["c2"] != pid["c1"], pid  # the raiser's verdict: a worker that ran no job before


def test_an_honest_batch_of_passing_jobs_confirms_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Four honest passing jobs: no run made again, no worker replaced, one worker for all."""
    verdicts, timings, stats = _batch(tmp_path, monkeypatch, [OK] * 4)
    assert all(v.status in CORRECT_STATUSES for v in verdicts), [v.error for v in verdicts]
    assert not any(_confirmations(v) for v in verdicts)
    assert stats["counters"][CONFIRMED] == 0, stats["counters"]
    assert stats["counters"].get("worker replaced by its standby", 0) == 0, stats["counters"]
    assert len({t["worker_pid"] for t in timings.values()}) == 1, timings


def test_lines_out_of_the_workers_protocol() -> None:
    """What the parent reads as tampering at each point of a job (`unexpected_line`): anything
    but the job's start line first, a start or settle reply during the job (a second settle
    reply), anything but a settle reply while the worker settles (a result)."""
    start, result, settled = {"started": "n1"}, {"nonce": "n1", "outcome": "ok"}, {"settled": 1}
    assert unexpected_line(start, "start", "n1") == ""
    assert "before the job's start" in unexpected_line({"started": "n0"}, "start", "n1")
    assert "before the job's start" in unexpected_line(result, "start", "n1")
    assert "before the job's start" in unexpected_line(settled, "start", "n1")
    assert unexpected_line({"progress": "performance"}, "job", "n1") == ""
    assert unexpected_line(result, "job", "n1") == ""
    assert "out of turn" in unexpected_line(settled, "job", "n1")
    assert "out of turn" in unexpected_line(start, "job", "n1")
    assert unexpected_line(settled, "settle", "n1") == ""
    assert "no settle reply" in unexpected_line(result, "settle", "n1")
    assert "out of turn" in unexpected_line(start, "settle", "n1")
    assert unexpected_line(None, "job", "n1") == ""  # no line: the caller's timeout or EOF


def test_confirmed_runs_a_suspect_outcome_once_more_and_keeps_the_fresh_one() -> None:
    """`confirmed`: an outcome that stands runs once; a suspect one runs again after the worker
    is replaced, the second outcome stands (never a third run), with why it was run again."""
    calls: list[str] = []

    def run(outs: list[RunOutcome]) -> RunOutcome:
        calls.append("run")
        return outs.pop(0)

    clean = RunOutcome({"outcome": "ok"})
    assert confirmed(lambda: run([clean]), lambda: calls.append("fresh")) is clean
    assert calls == ["run"]
    calls.clear()
    outs = [RunOutcome({"outcome": "runtime_error"}, suspect="the worker reported it", wall_s=2),
            RunOutcome({"outcome": "runtime_error"}, suspect="again", wall_s=3)]
    got = confirmed(lambda: run(outs), lambda: calls.append("fresh"))
    assert calls == ["run", "fresh", "run"]
    assert got.confirmed == "the worker reported it" and got.wall_s == 5
    assert got.payload is not None and got.payload["findings"][0]["rule"] == "confirmed_fresh"


def test_a_fresh_run_is_held_to_the_first_runs_fastest_checked_window() -> None:
    """`held_to_first`: the second run's runtime is no faster than the fastest window the judge
    checked in the first (a run that dies once its windows are slow gets no second draw); a
    slower second run, a first run with no checked window, or one whose worker held an
    earlier job's residue (none of it stands) leave the fresh figure as it is."""
    def fresh(runtime_us: float) -> RunOutcome:
        return RunOutcome({"outcome": "ok"}, clock={"figures": {"runtime_us": runtime_us}})

    def first(fastest_us: float | None, residue: str = "") -> RunOutcome:
        return RunOutcome(None, failure="worker exited with code 3", suspect="the worker failed",
                          fastest_us=fastest_us, residue=residue)

    for before, after, held in [(first(3300.0), 68.0, 3300.0), (first(3300.0), 4000.0, 4000.0),
                                (first(None), 68.0, 68.0),
                                (first(3300.0, residue="a line before"), 68.0, 68.0)]:
        outs = [before, fresh(after)]
        got = confirmed(lambda o=outs: o.pop(0), lambda: None)
        assert got.clock["figures"]["runtime_us"] == held, (before, after, got.clock)
        rules = [f["rule"] for f in got.payload["findings"]]
        assert ("held_to_first_windows" in rules) == (held != after), rules
        if held != after:
            assert got.clock["figures"]["fresh_runtime_us"] == after
