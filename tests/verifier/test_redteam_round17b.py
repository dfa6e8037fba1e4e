"""Red-team round 17b: the lead's own attacks of this session (the helper's are round 17).

Each was measured first (the "Before" of each test).
"""

from __future__ import annotations

import pytest
from redteam_round16_cases import COPYING_RELU
from redteam_round17b_cases import READY_REFRESHED
from test_redteam_round14 import _ok, _pid, _said, _why  # the rounds' shared readers

pytestmark = pytest.mark.heavy  # out of the default run: CI runs it (-m heavy)


def test_a_job_cannot_rewrite_what_the_worker_saw_when_ready() -> None:
    """On the real path (`GpuRunner`, cpu loop): COPYING_RELU, the attacker (an honest copying
    ReLU leaving READY_REFRESHED: numpy's `memmove` GOT entry pointed at `memset`, then the
    worker loop's `ready` snapshot made to say the libraries' tables as they are now),
    COPYING_RELU. Before (main at b4493cd, measured here): the attacker correct with no
    finding, its worker kept; the later honest ReLU "trial 1, checked by the verifier itself:
    output 0: 32722 of 65536 elements differ" (the judge's own failure: it stands). Now the
    snapshot is tuples in the loop's locals (`gpu_worker.ReadyState`): the refresh raises in
    the attacker's `__del__`, the GOT residue is found, its worker replaced."""
    from redteam_round14_cases import leaving
    from verifier_cases import cpu_loop_jobs

    outs, again = cpu_loop_jobs([COPYING_RELU, leaving(COPYING_RELU, READY_REFRESHED),
                                 COPYING_RELU], "r17ready")
    first, attacker, later = outs
    assert all(map(_ok, outs)), [_why(o) for o in outs]
    assert "GOT and RELRO pages" in _said(attacker), _said(attacker)
    assert _pid(first) == _pid(attacker) != _pid(later), list(map(_pid, outs))
    assert again == 0, again


def test_a_job_cannot_swap_the_backend_a_later_job_gets() -> None:
    """On the real path (`GpuRunner`, cpu loop): a numpy ReLU, the attacker (one leaving
    SLOW_BACKEND: its subclass, whose `synchronize` sleeps 2 ms, under every backend name),
    a numpy ReLU. Before (main at b4493cd, a dict registry, measured here): the attacker's
    worker kept with no finding; the later honest ReLU "run again in a fresh worker: the
    judge's windows beat its traced trials past its bound" (a cost per attack, and a subtler
    sleep would not be seen). Now each backend class is a global of `verifier.backends`,
    compared by identity after every job: the attacker is a cheat (run again in a fresh
    worker, as any failure after earlier jobs, and a cheat there too), its worker replaced,
    the later job correct in a fresh one, not run again."""
    from redteam_round7_cases import NUMPY_RELU
    from redteam_round14_cases import leaving
    from redteam_round17b_cases import SLOW_BACKEND
    from verifier_cases import cpu_loop_jobs

    outs, again = cpu_loop_jobs([NUMPY_RELU, leaving(NUMPY_RELU, SLOW_BACKEND), NUMPY_RELU],
                                "r17backend")
    first, attacker, later = outs
    assert "verifier.backends._backend_" in str(attacker.payload), attacker.payload
    assert _ok(first) and _ok(later), (_why(first), _why(later))
    assert attacker.payload["outcome"] == "cheat", attacker.payload
    assert _pid(later) != _pid(attacker) and not later.confirmed, (list(map(_pid, outs)), again)
