"""Red-team round 17b: the lead's own attacks of this session (the helper's are round 17).

Each was measured first (the "Before" of each test).
"""

from __future__ import annotations

from typing import Any

from redteam_round16_cases import COPYING_RELU
from redteam_round17b_cases import READY_REFRESHED
from test_redteam_round14 import _ok, _said  # the rounds' shared readers


def _why(out: Any) -> Any:
    return out.referee("run", {}) if out.referee else out.payload


def _pid(out: Any) -> Any:
    return (out.payload or {}).get("worker_pid")


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
