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
import verifier.judge.window_judge as window_judge
from verifier.judge.arena import Arena, views
from verifier.judge.window_judge import DEEP_CHECKS, RANDOM_CHECKS, CheckParts, WindowJudge

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

        def synchronize(device: str) -> None:  # the check's parts make none (`CheckParts`)
            work["synchronize"] += 1

        judge.model = reference
        monkeypatch.setattr(device_compare, "judge", compared)
        monkeypatch.setattr(torch, "equal", equal)
        monkeypatch.setattr(window_judge, "_synchronize", synchronize)
        why = judge.check(CALLS, deep)
        monkeypatch.undo()
        assert set(judge.parts) == {"draws", "reference", "compare", "inputs", "clone"}
        assert all(s >= 0 for s in judge.parts.values()), judge.parts
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
    too) and every input tensor of every set, as on a window that passes. No synchronization
    of the device in a check (its profile's parts made two a pick, and one for the clone)."""
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


class _Event:
    """A device's timing event as the judge uses one (recorded now, read once complete)."""

    made: list[_Event] = []
    now = [0.0]

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.at, self.waited = None, 0
        _Event.made.append(self)

    def record(self) -> None:
        self.at = _Event.now[0]

    def synchronize(self) -> None:
        self.waited += 1

    def elapsed_time(self, end: _Event) -> float:  # milliseconds, as torch's
        assert self.at is not None and end.at is not None
        return (end.at - self.at) * 1e3


def test_a_devices_check_parts_are_read_from_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a device the parts are the gaps between events recorded on its stream (no
    synchronization: only the last event is waited on, recorded after the check's last host
    read); each label's gaps add up."""
    monkeypatch.setattr(torch, "ksdev", type("ksdev", (), {"Event": _Event}), raising=False)
    _Event.made.clear()
    marks = CheckParts("ksdev:0")
    for label, at in (("clone", 0.5), ("draws", 1.0), ("reference", 3.0), ("compare", 3.5),
                      ("draws", 4.0), ("reference", 6.0), ("compare", 6.5), ("inputs", 7.0)):
        _Event.now[0] = at
        marks.done(label)
    parts = marks.seconds({"draws": 0.0})
    assert parts == pytest.approx({"clone": 0.5, "draws": 1.0, "reference": 4.0,
                                   "compare": 1.0, "inputs": 0.5})
    assert [e.waited for e in _Event.made] == [0] * 8 + [1]


def test_a_cpu_check_parts_are_the_host_clock() -> None:
    marks = CheckParts("cpu")
    marks.done("draws")
    marks.done("draws")
    parts = marks.seconds({})
    assert set(parts) == {"draws"} and parts["draws"] >= 0
