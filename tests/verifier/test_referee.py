"""The trusted referee (`verifier.referee`): a GPU worker's raw outputs judged in a process that
never runs candidate code, on inputs it regenerates from the parent's seed. Run here with the
cpu backend (the same process and protocol; on a GPU host `decide.DEVICE` is the GPU)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from verifier.referee import Referee

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


@pytest.fixture(scope="module")
def referee():
    ref = Referee({}, "cpu")
    yield ref
    ref.close()


def _args(input_seed: int) -> dict:
    return {"task_source": RELU_TASK, "seed": 0, "input_seed": input_seed, "trials": 3,
            "tol": TOL, "variants": [], "variants_checked": None}


def test_right_outputs_pass_and_wrong_or_missing_ones_do_not(referee: Referee,
                                                             tmp_path: Path) -> None:
    good = _trial_outputs(4242, 3)
    path = tmp_path / "outputs.pt"
    torch.save([good, None], path)
    assert referee("run", _args(4242), outputs=str(path)) == (True, "")
    # the same outputs for other inputs (a worker that replayed an earlier run): caught
    ok, why = referee("run", _args(777), outputs=str(path))
    assert not ok and "trial 1, checked by the verifier itself" in why, why
    bad = [good[0], good[1] * 0.5, good[2]]
    torch.save([bad, None], path)
    ok, why = referee("run", _args(4242), outputs=str(path))
    assert not ok and why.startswith("trial 2"), why
    torch.save([good[:2], None], path)
    ok, why = referee("run", _args(4242), outputs=str(path))
    assert not ok and "2 trial outputs, expected 3" in why, why
    ok, why = referee("run", _args(4242), outputs=str(tmp_path / "missing.pt"))
    assert not ok and "no raw outputs" in why, why


def test_a_referee_failure_is_an_error_not_a_verdict(referee: Referee, tmp_path: Path) -> None:
    path = tmp_path / "outputs.pt"
    torch.save([_trial_outputs(1, 3), None], path)
    broken = {**_args(1), "task_source": "raise SystemError('task does not load')"}
    with pytest.raises(RuntimeError, match="task does not load"):
        referee("run", broken, outputs=str(path))
    assert referee("run", _args(1), outputs=str(path)) == (True, "")  # still serving


def test_outputs_are_read_once_per_job_and_again_for_the_next(referee: Referee,
                                                             tmp_path: Path) -> None:
    good = _trial_outputs(99, 3)
    path = tmp_path / "outputs.pt"
    torch.save([good, None], path)
    assert referee("run", _args(99), outputs=str(path), job="1") == (True, "")
    # the parent rewrites the file for its next job: job 2 must see the new, wrong outputs
    torch.save([[good[0] * 0.5, good[1], good[2]], None], path)
    ok, why = referee("run", _args(99), outputs=str(path), job="2")
    assert not ok and why.startswith("trial 1"), why
    # a second op of job 2 is answered from the outputs job 2 read (the file is not re-read)
    path.unlink()
    ok, why = referee("run", _args(99), outputs=str(path), job="2")
    assert not ok and why.startswith("trial 1"), why
    # without a job number every call reads the file
    ok, why = referee("run", _args(99), outputs=str(path))
    assert not ok and "no raw outputs" in why, why
