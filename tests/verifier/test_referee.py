"""The trusted referee (`verifier.referee`): a GPU worker's raw outputs judged in a process that
never runs candidate code, on inputs it regenerates from the parent's seed. Run here with the
cpu backend (the same process and protocol; on a GPU host `decide.DEVICE` is the GPU)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from verifier.referee import Referee
from verifier.shared_outputs import write_sealed

sys.path.insert(0, str(Path(__file__).parent))
from verifier_cases import RELU_TASK  # noqa: E402

TOL = (1e-4, 1e-4, 1e-2, 1e-2)


def _trial_outputs(input_seed: int, trials: int) -> list[torch.Tensor]:
    """The right outputs, as an honest worker draws inputs (seed + 1000 + trial)."""
    ns: dict = {}
    exec(RELU_TASK, ns)
    outs = []
    for t in range(trials):
        torch.manual_seed(input_seed + 1000 + t)
        outs.append(torch.relu(*ns["get_inputs"]()))
    return outs


@pytest.fixture
def sealed() -> Iterator[Any]:
    """Outputs as a worker hands them over: a sealed memfd this process holds, named for the
    referee (a child of this process) by its /proc path; closed after the test."""
    fds: list[int] = []

    def make(obj: Any) -> dict[str, Any]:
        fd, _, layout = write_sealed(obj)
        fds.append(fd)
        return {"outputs": f"/proc/{os.getpid()}/fd/{fd}", "layout": layout}

    yield make
    for fd in fds:
        with contextlib.suppress(OSError):  # closed by the test itself
            os.close(fd)


def _close(shared: dict[str, Any]) -> None:
    os.close(int(shared["outputs"].rsplit("/", 1)[1]))


@pytest.fixture(scope="module")
def referee():
    ref = Referee({}, "cpu")
    yield ref
    ref.close()


def _args(input_seed: int) -> dict:
    return {"task_source": RELU_TASK, "seed": 0, "input_seed": input_seed, "trials": 3,
            "tol": TOL, "variants": [], "variants_checked": None}


def test_right_outputs_pass_and_wrong_or_missing_ones_do_not(referee: Referee,
                                                             sealed: Any) -> None:
    good = _trial_outputs(4242, 3)
    assert referee("run", _args(4242), **sealed([good, None])) == (True, "")
    # the same outputs for other inputs (a worker that replayed an earlier run): caught
    ok, why = referee("run", _args(777), **sealed([good, None]))
    assert not ok and "trial 1, checked by the verifier itself" in why, why
    ok, why = referee("run", _args(4242), **sealed([[good[0], good[1] * 0.5, good[2]], None]))
    assert not ok and why.startswith("trial 2"), why
    ok, why = referee("run", _args(4242), **sealed([good[:2], None]))
    assert not ok and "2 trial outputs, expected 3" in why, why
    ok, why = referee("run", _args(4242), outputs="")
    assert not ok and "no raw outputs" in why, why


def test_a_layout_that_does_not_fit_its_memfd_is_no_outputs(referee: Referee,
                                                           sealed: Any) -> None:
    good = _trial_outputs(5, 3)
    shared = sealed([good, None])
    assert referee("run", _args(5), **shared) == (True, "")
    # the layout comes from the worker: one that reads past the file, or calls the bytes
    # another dtype's, is not believed (no outputs: the run is not ok)
    meta = shared["layout"]["tensors"]
    for bad in ({**meta[2], "offset": meta[2]["offset"] + 64},
                {**meta[2], "dtype": "float64"}, {**meta[2], "dtype": "object"}):
        layout = {**shared["layout"], "tensors": [*meta[:2], bad]}
        ok, why = referee("run", _args(5), outputs=shared["outputs"], layout=layout)
        assert not ok and "no raw outputs" in why, (bad, why)


def test_a_referee_failure_is_an_error_not_a_verdict(referee: Referee, sealed: Any) -> None:
    shared = sealed([_trial_outputs(1, 3), None])
    broken = {**_args(1), "task_source": "raise SystemError('task does not load')"}
    with pytest.raises(RuntimeError, match="task does not load"):
        referee("run", broken, **shared)
    assert referee("run", _args(1), **shared) == (True, "")  # still serving


def test_outputs_are_mapped_once_per_job_and_again_for_the_next(referee: Referee,
                                                               sealed: Any) -> None:
    good = _trial_outputs(99, 3)
    first = sealed([good, None])
    assert referee("run", _args(99), **first, job="1") == (True, "")
    # job 2 brings other, wrong outputs: they are mapped, not job 1's
    second = sealed([[good[0] * 0.5, good[1], good[2]], None])
    ok, why = referee("run", _args(99), **second, job="2")
    assert not ok and why.startswith("trial 1"), why
    # a second op of job 2 is answered from what job 2 mapped, even with the memfd closed
    gone = sealed([good, None])
    assert referee("run", _args(99), **gone, job="3") == (True, "")
    _close(gone)
    assert referee("run", _args(99), **gone, job="3") == (True, "")
    # without a job number every call maps its path: now gone, so no outputs
    ok, why = referee("run", _args(99), **gone)
    assert not ok and "no raw outputs" in why, why


def test_the_trials_judged_on_the_referees_arena(referee: Referee) -> None:
    """`trials`: the referee draws the trials' inputs into an arena whose descriptor it sends;
    a worker's side (here this process) copies outputs into the slots; `trials_check` answers
    with a few figures, never with output-sized data."""
    from verifier.referee import RemoteTrials
    from verifier.trial_io import ArenaTrials

    args = {**_args(31), "window_max": 16 << 20, "cpu_free": 1 << 30}
    for scale, want in ((1.0, True), (0.5, False)):
        reply, fd = referee.prepare(args, op="trials")
        assert fd >= 0 and reply["spec"]["trials"] == 3
        assert reply["footprint"]["inputs"] == 16 * 1024 * 4
        trials = RemoteTrials(referee, reply)
        io = ArenaTrials(trials.spec, fd, "cpu")
        os.close(fd)
        for t in range(3):
            io.keep(0, t, torch.relu(io.inputs(0, t)[0]) * (scale if t == 2 else 1.0))
        ok, why, stats = trials.check(io.report()["trial_report"], None)
        assert ok is want, why
        if want:
            assert stats == {"max_abs_diff": 0.0, "mean_abs_diff": 0.0, "mismatch_frac": 0.0,
                             "rel_norm": 0.0}
        else:
            assert why.startswith("trial 3, checked by the verifier itself"), why
        io.close()
        trials.close()
    reply, fd = referee.prepare({**args, "cpu_free": 1 << 20}, op="trials")
    assert fd == -1 and "for one trial" in reply["does_not_fit"], reply
