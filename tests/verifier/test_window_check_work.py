"""A window check does the same work whether, and where, it fails (issue 28): the judge's
clock serves the planned windows after a failed check so that a caught worker cannot tell, but
a check that stopped at the first wrong output answered sooner, and a worker timing the gap
from its "d" to the next window's order could still tell. `WindowJudge.check` now runs every
pick's reference and comparison and compares every input tensor before it answers, with the
first failure's message (`verifier.judge.window_judge`). The referee's check on a GPU is this
same method (`verifier.judge.referee`: its "check" op calls it), so this covers it.

The work is counted, not timed: the reference calls, the output comparisons and the input
tensors compared (`torch.equal`) of one window, over the worker's real arena file."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

import verifier.judge.device_compare as device_compare
from verifier.judge.arena import Arena, views
from verifier.judge.window_judge import DEEP_CHECKS, RANDOM_CHECKS, WindowJudge

TOL = (1e-4, 1e-4, 1e-2, 1e-2)
CALLS = 6  # a deep check of this many compares every call (fewer than DEEP_CHECKS)
# two inputs per set: a set whose first tensor was modified still has its second compared
TWO_INPUTS = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, y):
        return x * 3.0 + y


def get_inputs():
    return [torch.randn(8, 16), torch.randn(8, 16)]


def get_init_inputs():
    return []
'''


def _window(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, deep: bool,
            wrong_calls: set[int], modify_sets: set[int]) -> tuple[str, Counter]:
    """One window of CALLS calls: the worker's arena written right except the outputs of
    `wrong_calls` and the first input of `modify_sets`; the check's answer and its work."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = str(tmp_path / "arena.bin")
    judge = WindowJudge(TWO_INPUTS, 0, TOL, 1 << 20, path=path)
    worker = Arena.attach(path, judge.spec["nbytes"], "cpu")
    work: Counter = Counter()
    try:
        sets = [views(worker, lay) for lay in judge.spec["sets"]]
        outs = [views(worker, lay) for lay in judge.spec["outs"]]
        judge.fill(CALLS)
        for k in range(CALLS):
            x, y = sets[k]
            outs[k].copy_(x * 3.0 + y + (1.0 if k in wrong_calls else 0.0))
        for k in modify_sets:
            sets[k][0].add_(1.0)  # after its call: the judge's pristine copy tells
        model, real_judge, real_equal = judge.model, device_compare.judge, torch.equal

        def reference(*args: Any) -> Any:
            work["reference"] += 1
            return model(*args)

        def compared(*args: Any, **kw: Any) -> Any:
            work["outputs"] += 1
            return real_judge(*args, **kw)

        def equal(a: Any, b: Any) -> bool:
            work["input_tensors"] += 1
            return real_equal(a, b)

        judge.model = reference
        monkeypatch.setattr(device_compare, "judge", compared)
        monkeypatch.setattr(torch, "equal", equal)
        why = judge.check(CALLS, deep)
        monkeypatch.undo()
        return why, work
    finally:
        worker.close()
        judge.close()


@pytest.mark.parametrize("deep", [False, True])
def test_a_failing_check_does_a_passing_checks_work(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    deep: bool) -> None:
    """The last call's output is the first pick: wrong there, the check used to answer after
    one comparison, with no input compared. Now every pick is compared (their references run
    too) and every input tensor of every set, as on a window that passes."""
    assert CALLS - 1 <= DEEP_CHECKS
    picks = CALLS if deep else 1 + RANDOM_CHECKS
    passing, work = _window(tmp_path / "pass", monkeypatch, deep, set(), set())
    assert passing == ""
    assert work == {"reference": picks, "outputs": picks, "input_tensors": 2 * CALLS}, work
    failures = {
        "last call": ({CALLS - 1}, set()),
        "every call": (set(range(CALLS)), set()),
        "inputs": (set(), {0, CALLS - 1}),
        "all of it": (set(range(CALLS)), set(range(CALLS))),
    }
    for name, (wrong, modified) in failures.items():
        why, failed = _window(tmp_path / name.replace(" ", "_"), monkeypatch, deep, wrong,
                              modified)
        assert why, name
        assert failed == work, (name, failed, work)


def test_the_first_failures_message_is_kept(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Picks are compared in order (the last call first) and the inputs after them: the answer
    is the first failure found, as when the check stopped there."""
    head = "the output of a timed call was wrong: call "
    why, _ = _window(tmp_path / "a", monkeypatch, True, {0, CALLS - 1}, {1})
    assert why.startswith(f"{head}{CALLS} of {CALLS}: output 0: "), why
    why, _ = _window(tmp_path / "b", monkeypatch, True, {2, 4}, {1})
    assert why.startswith(f"{head}3 of {CALLS}: output 0: "), why  # picks: last, then 1..n-1
    why, _ = _window(tmp_path / "c", monkeypatch, True, set(), {3})
    assert why == "forward modified its input tensors during a timed call", why
