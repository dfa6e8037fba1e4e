"""Paced trials past the sets a trial arena holds (`verifier.judge.trial_judge`: `paced`,
`_publish_again`, `_check_now`). On an H100, 29 correct level-1 verdicts of KernelBench's
GB-sized problems ran with 1-2 trials: admission held no more sets, so the trial-pace rule
(`verifier.judge.trial_pace`, a run whose windows beat its traced trials) had no figure and was
off. Now a paced job runs every trial asked (at least `PACED_TRIALS`), trial t on set t mod
sets, each trial whose set a later one reuses checked at its "q". On cpu, with a budget that
admits one set of RELU_TASK (16 x 1024 fp32): the admission arithmetic a GPU's 6 GiB task
meets."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from verifier.judge.trial_io import ArenaTrials
from verifier.judge.trial_judge import TrialJudge
from verifier.judge.trial_pace import PACED_TRIALS

sys.path.insert(0, str(Path(__file__).parent))
from test_early_trials import HONEST, WRONG  # noqa: E402
from verifier_cases import RELU_TASK, cpu_loop_jobs  # noqa: E402

TOL = (1e-4, 1e-4, 1e-2, 1e-2)
ONE_SET = 571_211_776  # the free bytes at which RELU_TASK's admission holds one trial set
TWO_SETS = 571_342_848
VALUE_TASK = RELU_TASK.replace("return torch.relu(x)", "return torch.relu(x), 3")


def _judge(free: int, trials: int = 3, task: str = RELU_TASK) -> TrialJudge:
    return TrialJudge({"task_source": task, "seed": 0, "input_seed": 777, "trials": trials,
                       "tol": TOL, "variants": [], "stepped": True}, free, 16 << 20)


def _run(judge: TrialJudge, out_of: object) -> tuple[bool, str, dict[str, float]]:
    """Every paced trial as the worker and the clock run them: "p" (publish), the call and its
    slot, "q" (seal); then the check with the worker's report."""
    io = ArenaTrials(judge.spec, os.dup(judge.arena.fd), "cpu")
    try:
        for t in range(io.trials()):
            judge.publish(t)
            out = out_of(t, io.inputs(0, t)[0])  # type: ignore[operator]
            if out is None:  # writes nothing into its slot
                io.values[0].append([])
            else:
                io.keep(0, t, out)
            judge.seal(t)
        return judge.check(io.report()["trial_report"], None)
    finally:
        io.close()


@pytest.mark.parametrize("free, sets", [(ONE_SET, 1), (TWO_SETS, 2)])
def test_paced_trials_run_when_fewer_sets_fit(free: int, sets: int) -> None:
    """Before (main at 0be5737): `spec["trials"]` was the sets held (1 or 2), the worker ran
    that many trials, and the clock had no `trial_us`. Now PACED_TRIALS (not every trial
    asked: each reused set costs a check at its "q", ~65 ms a 6 GiB trial on an H100)."""
    judge = _judge(free, trials=5)
    n = PACED_TRIALS
    try:
        assert judge.admission.trial_sets == sets and len(judge.spec["blocks"][0]) == sets
        assert judge.spec["trials"] == judge.paced == n
        ok, why, stats = _run(judge, lambda t, x: torch.relu(x))
        assert (ok, why) == (True, ""), why
        assert set(judge.seals) == set(range(n)) and stats["mismatch_frac"] == 0.0
        assert sorted(judge.in_slot) == list(range(n - sets, n)), judge.in_slot  # the last
    finally:
        judge.close()


def test_a_wrong_trial_on_a_reused_set_fails_at_its_end() -> None:
    """Trial 1's output is wrong and trial 2 overwrites its slot with a right one: the check at
    trial 1's "q" saw it."""
    judge = _judge(ONE_SET)
    try:
        ok, why, _ = _run(judge, lambda t, x: torch.zeros_like(x) if t == 0 else torch.relu(x))
        assert not ok and why.startswith("trial 1, checked by the verifier itself: "), why
    finally:
        judge.close()


def test_a_reused_slot_is_poisoned_again() -> None:
    """A run that writes nothing for trial 2 (a cache of trial 1's output left in the slot):
    the slot holds the judge's poison again, not trial 1's output."""
    judge = _judge(ONE_SET)
    try:
        ok, why, _ = _run(judge, lambda t, x: None if t == 1 else torch.relu(x))
        assert not ok and why.startswith("trial 2, checked by the verifier itself: "), why
    finally:
        judge.close()


def test_inputs_mutated_on_a_reused_set_are_seen() -> None:
    def mutates(t: int, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(x)
        if t == 0:
            x.zero_()
        return out

    judge = _judge(ONE_SET)
    try:
        ok, why, _ = _run(judge, mutates)
        assert not ok and "modified its input tensors" in why, why
    finally:
        judge.close()


def test_an_output_with_plain_values_keeps_the_sets() -> None:
    """A plain value (an int beside the tensor) is reported only at the end: no trial of such
    an output can be checked at its "q", so its trials are the sets held (as before)."""
    judge = _judge(ONE_SET, trials=5, task=VALUE_TASK)
    try:
        assert judge.paced == judge.spec["trials"] == judge.admission.trial_sets
    finally:
        judge.close()


def test_the_worker_loop_gets_the_trial_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the persistent worker's loop (the GPU's path): a job whose arena holds one set
    runs three paced trials, so the clock has `trial_us` and the rule is on; a wrong run is
    still `incorrect`."""
    from verifier.run import gpu_runner

    monkeypatch.setattr(gpu_runner, "CPU_TRIALS_BYTES", ONE_SET)
    (honest, wrong), _ = cpu_loop_jobs([HONEST, WRONG], "reuse", task=RELU_TASK)
    assert honest.payload["trials"] == PACED_TRIALS, honest.payload.get("trials")
    assert honest.clock["trials"][0] is True, honest.clock
    assert len(honest.clock["figures"]["trials_us"]) == PACED_TRIALS, honest.clock["figures"]
    assert honest.clock["figures"]["trial_us"] > 0
    assert wrong.clock["trials"][0] is False, wrong.clock
