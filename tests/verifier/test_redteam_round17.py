"""Red-team round 17 on the cpu backend: attacks on branch attack17 (from main at b4493cd), as a
policy rewarded for holes would try them (cases in tests/verifier/redteam_round17_cases.py).
Each was measured first (the "Before" of each test); an open one is a strict xfail naming its
fix.

Open (xfail): code that runs as an object dies, hidden from the settle's scan
(`disarm.pin_mortal`) by a metaclass that denies `__del__`, a weak reference subclass whose
`__callback__` reads None, or `PyObject_GC_UnTrack`: it ran as the next job began (a GIL hog
made an honest sibling's ReLU 50x slower, its verdict standing). The fix's reader is here
(`verifier.run.mortal.mortal_of`: C slots, the C callback, untracked objects walked); its
use is the lead's (`disarm.py`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from redteam_round7_cases import NUMPY_RELU
from redteam_round17_cases import SETTLED, WAYS, hidden_hog
from test_redteam_round9b import _at_settle
from test_redteam_round14 import _ok, _said  # the rounds' shared readers

ROOT = Path(__file__).resolve().parents[2]


def _why(out: Any) -> Any:
    return out.referee("run", {}) if out.referee else out.payload


def _pid(out: Any) -> Any:
    return (out.payload or {}).get("worker_pid")


def _runtime(out: Any) -> float:
    return float(((out.clock or {}).get("figures") or {}).get("runtime_us") or 0.0)


# --- 1. code hung on an object that dies in the next job, hidden from the settle's scan ---------
OPEN_DEATH = pytest.mark.xfail(strict=True, reason=(
    "open: `disarm.pin_mortal` asks Python (`hasattr(kind, '__del__')`, `obj.__callback__`) "
    "and sees only what `gc.get_objects()` lists; fix: in `disarm.pin_mortal`, "
    "`held = mortal.mortal_of(gc.get_objects())` (verifier.run.mortal: the type's C finalizer "
    "slots or `__del__` in its own MRO's dicts, the weak reference's C callback, and the "
    "untracked objects of collected types the listed ones hold)"))
HOG_WAYS = ["plain", *(pytest.param(w, marks=OPEN_DEATH) for w in WAYS if w != "plain")]


@pytest.fixture(scope="module")
def hogged() -> dict[str, tuple[Any, Any, Any]]:
    """On the real path (`GpuRunner`, cpu loop), one sequence: an honest numpy ReLU, then for
    each way the attacker (an honest ReLU that, as its worker settles it, hangs a GIL hog on
    the settle's message in the worker's loop, `hidden_hog`) and an honest ReLU."""
    from verifier_cases import cpu_loop_jobs

    ways = list(WAYS)
    sources = [NUMPY_RELU]
    for way in ways:
        sources += [_at_settle(hidden_hog(way)), NUMPY_RELU]
    outs, _ = cpu_loop_jobs(sources, "r17hog")
    return {way: (outs[0], outs[1 + 2 * i], outs[2 + 2 * i]) for i, way in enumerate(ways)}


@pytest.mark.parametrize("way", HOG_WAYS)
def test_code_a_job_hangs_on_a_dying_object_runs_in_no_later_job(
        hogged: dict[str, tuple[Any, Any, Any]], way: str) -> None:
    """Before (attack17 at b4493cd, measured here, three sequences): for "plain" (round 10's
    `__del__`) the object was held and the later ReLU timed as the first (67-89 us a call);
    for each hidden way the attacker was correct with no finding, and the next job's honest
    ReLU either stood correct at 822-3932 us a call (the first: 66-86 us; its worker then
    replaced for "native threads", the hog's, after its timing) or was run again in a fresh
    worker ("the judge's windows beat its traced trials past its bound": a run's throughput
    per attack), as the hog fell on its trials or windows. With `later` rebinding torch.relu
    instead (`redteam_later_cases.LATER`), the honest ReLU was a cheat in the attacker's
    worker and run again in a fresh one. Held: timed as the first, nothing run again (the
    control's run again is the host's noise, not asserted)."""
    first, attacker, later = hogged[way]
    assert _ok(first) and _ok(attacker), (_why(first), _why(attacker))
    assert _ok(later), _why(later)
    assert 0 < _runtime(later) < 3 * _runtime(first) + 100.0, (_runtime(first),
                                                               _runtime(later), _said(later))
    assert way == "plain" or not later.confirmed, later.confirmed


@pytest.mark.parametrize("way", sorted(WAYS))
@pytest.mark.parametrize("scan", ["fixed", pytest.param("as is", marks=OPEN_DEATH)])
def test_a_settle_holds_what_runs_code_as_it_dies(way: str, scan: str) -> None:
    """In one process (SETTLED: a settle as the worker makes them, then the anchor dropped):
    `later` must not run. Before (attack17 at b4493cd, measured here): "plain" 0, each hidden
    way 1 (the "as is" xfails); with `mortal.mortal_of` as the scan ("fixed"), 0 for each."""
    if scan == "as is" and way == "plain":
        pytest.skip("the control: held as is (the fixed scan's row checks it too)")
    out = subprocess.run([sys.executable, "-c", SETTLED, way, scan.replace(" ", "_")],
                         capture_output=True, text=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "0", out.stdout
