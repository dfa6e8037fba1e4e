"""Stepped trials (`verifier.judge.trial_judge`, `verifier.judge.trial_pace`): a paced job's
trial inputs exist in the judge's arena only from the trial's "p" on, its slot is sealed at its
"q", and a paced job has at least `PACED_TRIALS` trials. On cpu tensors in one process (a memfd
arena, as the persistent worker's cpu loop has; the referee runs the same code on a GPU)."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from verifier.judge import decide
from verifier.judge.clock import JudgeClock
from verifier.judge.clock_serve import FDS_ENV
from verifier.judge.trial_io import ArenaTrials
from verifier.judge.trial_judge import TrialJudge, fingerprint
from verifier.judge.trial_pace import PACED_TRIALS, WorkerPace, trial_figures

sys.path.insert(0, str(Path(__file__).parent))
from verifier_cases import RELU_TASK  # noqa: E402

TOL = (1e-4, 1e-4, 1e-2, 1e-2)


def _judge(trials: int = 3, stepped: bool = True) -> TrialJudge:
    return TrialJudge({"task_source": RELU_TASK, "seed": 0, "input_seed": 4242,
                       "trials": trials, "tol": TOL, "variants": [], "stepped": stepped},
                      1 << 30, 16 << 20)


def _io(judge: TrialJudge) -> ArenaTrials:
    return ArenaTrials(judge.spec, os.dup(judge.arena.fd), "cpu")


def _pristine(judge: TrialJudge, t: int) -> list[Any]:
    return decide.make_inputs(judge.main.get_inputs, judge.main.seeds[t])


def test_a_trials_inputs_exist_only_once_it_is_published() -> None:
    """Before `publish(t)` the worker's view of trial t's inputs is the judge's poison (NaN),
    after it the seed's draw; publishing trial 0 leaves trial 1 unpublished (a cpu judge holds
    the drawn sets in its own copy, which no worker maps)."""
    judge = _judge()
    io = _io(judge)
    try:
        assert all(torch.isnan(io.inputs(0, t)[0]).all() for t in range(io.trials()))
        judge.publish(0)
        assert torch.equal(io.inputs(0, 0)[0], _pristine(judge, 0)[0])
        assert torch.isnan(io.inputs(0, 1)[0]).all()
        judge.publish(1)
        assert torch.equal(io.inputs(0, 1)[0], _pristine(judge, 1)[0])
    finally:
        io.close()
        judge.close()


@pytest.mark.parametrize("asked", [1, 2, 5])
def test_a_paced_job_has_enough_trials_for_the_clocks_figure(asked: int) -> None:
    """`trials=2` (an operator's option) left one trial past the warm-up and the rule off: a
    stepped judge holds at least PACED_TRIALS (more where asked); an unpaced one what it was
    asked."""
    stepped, plain = _judge(asked), _judge(asked, stepped=False)
    try:
        assert stepped.spec["trials"] == max(asked, PACED_TRIALS)
        assert len(stepped.spec["blocks"][0]) == max(asked, PACED_TRIALS)
        assert plain.spec["trials"] == asked
    finally:
        stepped.close()
        plain.close()


def _honest(judge: TrialJudge, io: ArenaTrials, t: int) -> None:
    judge.publish(t)
    io.keep(0, t, torch.relu(io.inputs(0, t)[0]))
    judge.seal(t)


@pytest.mark.parametrize("fingerprints", [False, True])
def test_an_honest_stepped_worker_passes(fingerprints: bool) -> None:
    """Both ways a judge keeps a sealed slot: a cpu judge's copy, a device's fingerprint (run
    here on the cpu arena, as the referee runs it on a GPU)."""
    judge = _judge(2)
    judge.fingerprints = fingerprints
    io = _io(judge)
    try:
        for t in range(io.trials()):
            _honest(judge, io, t)
        ok, why, stats = judge.check(io.report()["trial_report"], None)
        assert (ok, why) == (True, ""), why
        assert set(judge.seals) == set(range(PACED_TRIALS)) and stats["mismatch_frac"] == 0.0
    finally:
        io.close()
        judge.close()


@pytest.mark.parametrize("fingerprints", [False, True])
def test_a_slot_written_after_its_trials_end_does_not_count(fingerprints: bool) -> None:
    """A worker that says "q" with the slot wrong and writes the right output later: the cpu
    judge compares the slot as it read it at the "q" (wrong); the device judge sees that the
    slot is not what it was when the trial ended."""
    judge = _judge()
    judge.fingerprints = fingerprints
    io = _io(judge)
    try:
        for t in range(io.trials()):
            judge.publish(t)
            io.keep(0, t, torch.zeros_like(io.inputs(0, t)[0]) if t == 1
                    else torch.relu(io.inputs(0, t)[0]))
            judge.seal(t)
        io.keep(0, 1, torch.relu(io.inputs(0, 1)[0]))  # the right output, after trial 2's "q"
        io.values[0].pop()  # (the report holds one entry per trial, as the worker's would)
        ok, why, _ = judge.check(io.report()["trial_report"], None)
        assert not ok and why.startswith("trial 2, checked by the verifier itself: "), why
        assert ("changed after the trial ended" in why) == fingerprints, why
    finally:
        io.close()
        judge.close()


def test_outputs_computed_before_their_inputs_are_published_are_wrong() -> None:
    """Round 12's `ahead`: every trial's output computed in the first trial, from what the arena
    held then (the later trials' poison), returned at once later: trial 2 is wrong."""
    judge = _judge()
    io = _io(judge)
    try:
        judge.publish(0)
        ahead = [torch.relu(io.inputs(0, t)[0]) for t in range(io.trials())]
        io.keep(0, 0, ahead[0])
        judge.seal(0)
        for t in range(1, io.trials()):
            judge.publish(t)
            io.keep(0, t, ahead[t])
            judge.seal(t)
        ok, why, _ = judge.check(io.report()["trial_report"], None)
        assert not ok and why.startswith("trial 2, checked by the verifier itself"), why
    finally:
        io.close()
        judge.close()


def test_a_trial_the_clock_did_not_pace_fails_and_a_seal_is_once() -> None:
    judge = _judge()
    io = _io(judge)
    try:
        _honest(judge, io, 0)
        with pytest.raises(ValueError, match="sealed twice"):
            judge.seal(0)
        for t in range(1, io.trials()):
            judge.publish(t)
            io.keep(0, t, torch.relu(io.inputs(0, t)[0]))
        judge.seal(1)  # trial 3's "q" never came
        ok, why, _ = judge.check(io.report()["trial_report"], None)
        assert not ok and "trial 3" in why and "not paced" in why, why
        with pytest.raises(ValueError, match="no paced trial"):
            _judge(stepped=False).publish(0)
    finally:
        io.close()
        judge.close()


def test_the_fingerprint_is_keyed_and_sees_every_byte() -> None:
    """Equal bytes and key: equal; any one byte changed (in any chunk), or another key: not."""
    data = torch.randint(0, 256, (10_000,), dtype=torch.uint8)
    base = fingerprint(data, 7, 4096)
    assert fingerprint(data.clone(), 7, 4096) == base
    assert fingerprint(data, 8, 4096) != base
    for i in (0, 4095, 4096, 9_999):
        for bit in (1, 128):  # 128 at a word's last byte: the word's sign (a change of 2^31)
            changed = data.clone()
            changed[i] ^= bit
            assert fingerprint(changed, 7, 4096) != base, (i, bit)
    odd = data[1:]  # a slot that does not start on a word: byte by byte
    assert fingerprint(odd.clone(), 7, 4096) == fingerprint(odd, 7, 4096)
    moved = odd.clone()
    moved[-1] ^= 1
    assert fingerprint(moved, 7, 4096) != fingerprint(odd, 7, 4096)


class _Windows:
    """A window judge as the clock sees it before any window, with the job's trial judge."""

    sets, copy_s, set_bytes, out_bytes = 1, 0.0, 0, 0

    def __init__(self, trials: TrialJudge) -> None:
        self.trials = trials


def test_the_clock_publishes_each_trial_at_its_go_and_seals_it_at_its_done(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The real pipes and the real `WorkerPace`: the worker sees trial t's inputs only inside
    its paced trial (the next trial's are still poison there), every trial is sealed, the
    judge's check passes, and the clock has its figure (`trials=2` asked: three paced)."""
    req_r, req_w = os.pipe()
    go_r, go_w = os.pipe()
    os.set_blocking(req_r, False)
    monkeypatch.setenv(FDS_ENV, f"{req_w},{go_r}")
    judge = _judge(2)
    io = ArenaTrials(judge.spec, os.dup(judge.arena.fd), "cpu", paced=True)
    clock = JudgeClock(_Windows(judge), fds=(req_r, go_w), wait_s=10.0)
    clock.trials_due = judge.spec["trials"]
    seen: list[bool] = []

    def worker() -> None:
        pace = WorkerPace(True)
        try:
            for t in range(io.trials()):
                with pace.trial():
                    x = io.inputs(0, t)[0]
                    later = io.inputs(0, t + 1) if t + 1 < io.trials() else None
                    seen.append(not torch.isnan(x).any() and (
                        later is None or bool(torch.isnan(later[0]).all())))
                    io.keep(0, t, torch.relu(x))
        finally:
            pace.close()

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(10.0)
    deadline = time.monotonic() + 5.0
    while len(judge.seals) < PACED_TRIALS and time.monotonic() < deadline:
        time.sleep(0.01)
    clock.stop()
    try:
        assert seen == [True] * PACED_TRIALS, seen
        assert set(judge.seals) == set(range(PACED_TRIALS)) and not clock.failure
        assert "trial_us" in trial_figures(clock.trial_s)
        assert judge.check(io.report()["trial_report"], None)[:2] == (True, "")
    finally:
        for fd in (req_r, req_w, go_r, go_w):
            os.close(fd)
        io.close()
        judge.close()
