"""The trusted referee (`verifier.judge.referee`): a GPU worker's trials judged on the referee's own
arena in a process that never runs candidate code, on inputs it draws from the parent's seed.
Run here with the cpu backend (the same process and protocol; on a GPU host `decide.DEVICE` is
the GPU and the arena is device memory)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from verifier.judge.referee import Referee

sys.path.insert(0, str(Path(__file__).parent))
from verifier_cases import RELU_TASK  # noqa: E402

TOL = (1e-4, 1e-4, 1e-2, 1e-2)


@pytest.fixture(scope="module")
def referee():
    ref = Referee({}, "cpu")
    yield ref
    ref.close()


def _args(input_seed: int) -> dict:
    return {"task_source": RELU_TASK, "seed": 0, "input_seed": input_seed, "trials": 3,
            "tol": TOL, "variants": []}


def test_a_referee_failure_is_an_error_not_a_verdict(referee: Referee) -> None:
    broken = {**_args(1), "task_source": "raise SystemError('task does not load')"}
    with pytest.raises(RuntimeError, match="task does not load"):
        referee.prepare(broken, op="trials")
    reply, fd = referee.prepare({**_args(1), "cpu_free": 1 << 30}, op="trials")  # still serving
    assert fd >= 0 and reply["spec"]["trials"] == 3
    os.close(fd)
    referee.request("trials_release", {})


def test_the_trials_judged_on_the_referees_arena(referee: Referee) -> None:
    """`trials`: the referee draws the trials' inputs into an arena whose descriptor it sends;
    a worker's side (here this process) copies outputs into the slots; `trials_check` answers
    with a few figures, never with output-sized data."""
    from verifier.judge.referee import RemoteTrials
    from verifier.judge.trial_io import ArenaTrials

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


def test_a_reference_out_of_device_memory_is_does_not_fit(referee: Referee) -> None:
    """The reference itself running out of device memory beside its worker (on a GPU:
    torch.OutOfMemoryError, or cuMemCreate's out of memory for the arena) is the task's size,
    answered `does_not_fit`; any other failure of the reference stays an error."""
    oom = RELU_TASK.replace("def get_inputs():", "def get_inputs():\n    raise RuntimeError("
                            "'CUDA out of memory. Tried to allocate 12.00 GiB')\n\n\ndef _x():")
    reply, fd = referee.prepare({**_args(2), "task_source": oom}, op="trials")
    assert fd == -1 and "does not fit the device" in reply["does_not_fit"], reply
    assert "Tried to allocate 12.00 GiB" in reply["does_not_fit"]
    other = oom.replace("CUDA out of memory", "a plain failure")
    with pytest.raises(RuntimeError, match="a plain failure"):
        referee.prepare({**_args(2), "task_source": other}, op="trials")


def test_a_reference_built_only_on_the_host_is_answered_host_only(referee: Referee) -> None:
    """The referee builds its reference by the run's construction method
    (`verifier.judge.construct`); one that refuses the device context is answered `host_only`
    (the parent runs the job again with `construct: host`), and then it is judged."""
    refuses = RELU_TASK.replace(
        "import torch\n", "import torch\nfrom torch.overrides import "
        "_get_current_function_mode_stack\n", 1).replace(
        "super().__init__()", "super().__init__()\n        if _get_current_function_mode_stack():\n"
        "            raise RuntimeError('no device context here')", 1)
    assert refuses != RELU_TASK and "no device context here" in refuses
    args = {**_args(5), "task_source": refuses, "cpu_free": 1 << 30}
    reply, fd = referee.prepare(args, op="trials")
    assert fd == -1 and "no device context here" in reply["host_only"], reply
    assert "builds on the host" in reply["host_only"]
    reply, fd = referee.prepare({**args, "construct": "host"}, op="trials")
    assert fd >= 0 and reply["spec"]["trials"] == 3, reply
    os.close(fd)
    referee.request("trials_release", {})
