"""Code of an earlier job of a persistent worker (`verifier.run.gpu_worker`, its cpu loop here)
that runs during a later job, an honest sibling's (cases: tests/verifier/redteam_later_cases.py).

Round 10 left one open (a strict xfail; its in-process forms are there now): torch's own
finalizer function given torch's handle type whose `on_destroy` is the candidate's passed
the settle as torch's, with no object known that dies in a later job. Each attack below
rebinds `torch.relu` wherever it runs, so the job it runs in is called a cheat; each was
measured on main at 258f195 first (the "Before" of each test), one worker sequence per attack
(`test_redteam_round9._jobs`). Here they run as one sequence (`chain`); without `confirmed`
(GpuRunner's fresh-worker rerun of a failing verdict), to see what the settle and the residue
checks alone do. Fixed: death-triggered code is detached or held (`verifier.run.disarm`), the
registries are residue (`verifier.run.tamper`: logging's hooks, torch's custom-op tables, keys
of no str, tempfile and shutil as the loop's modules, sys.monitoring on 3.12). Open (strict
xfail): objects the job froze itself, behind as many frozen ones let die, escape the scan.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from redteam_later_cases import (  # noqa: E402
    ASK_LOG,
    CUSTOM_OP_RELU,
    EXITER,
    LATER,
    LIBRARY_RELU,
    LOGGER,
    OPDEF,
    SHADOW,
    death,
)
from redteam_round7_cases import NUMPY_RELU  # noqa: E402
from test_redteam_round9 import _jobs, _leaving, _said  # noqa: E402
from test_redteam_round9b import _at_settle  # noqa: E402

pytestmark = pytest.mark.heavy  # out of the default run: CI runs it (-m heavy)

ROOT = Path(__file__).resolve().parents[2]

# the next job's `tempfile` names are drawn by a generator of the job's own class: no object
# dies, its method is called (`tempfile._name_sequence.rng.choices`)
RNG = LATER + """
import random, tempfile


class Rng(random.Random):
    def choices(self, *a, **k):
        later()
        return random.Random.choices(self, *a, **k)


tempfile._get_candidate_names()._rng = Rng()
"""


def _asking(code: str) -> str:
    """A numpy ReLU whose forward runs `code` (which raises what it found) first."""
    return NUMPY_RELU.replace("        import numpy as np\n", f"        {code}\n")


@pytest.fixture(scope="module")
def chain() -> dict[str, list[dict[str, Any]]]:
    """Each attack and the honest jobs after it, in one worker's sequence (a job that ends its
    worker starts the next one)."""
    runs = {"handle": [_at_settle(death("handle")), NUMPY_RELU, NUMPY_RELU],
            "ref": [_at_settle(death("ref")), NUMPY_RELU],
            "del": [_at_settle(death("del")), NUMPY_RELU], "shadow": [_leaving(SHADOW), NUMPY_RELU],
            "log": [_leaving(LOGGER), _asking(ASK_LOG)], "opdef": [_leaving(OPDEF), CUSTOM_OP_RELU],
            "custom_ops": [CUSTOM_OP_RELU, CUSTOM_OP_RELU, LIBRARY_RELU, LIBRARY_RELU, NUMPY_RELU],
            "rng": [_leaving(RNG), NUMPY_RELU], "exit": [_leaving(EXITER), NUMPY_RELU, NUMPY_RELU]}
    got = _jobs([src for srcs in runs.values() for src in srcs])
    out, i = {}, 0
    for name, srcs in runs.items():
        out[name], i = got[i:i + len(srcs)], i + len(srcs)
    return out


@pytest.mark.parametrize("name", ["handle", "ref", "del"])
def test_what_a_job_left_to_die_later_does_not_run_in_a_later_job(
        chain: dict[str, list[dict[str, Any]]], name: str) -> None:
    """As its worker settles it, the job hangs code on the settle's message in the worker's own
    loop, which dies as the loop reads the next job's: torch's `_del_library` finalizer with a
    handle whose `on_destroy` is the job's (round 10's xfail), a `weakref.ref` callback, a
    `__del__` of the job's own class. Before (main at 258f195, measured): each attacker passed
    with no finding, and the next job, an honest numpy ReLU, was a cheat in the same worker
    ("torch.relu changed during the run"). Now at the settle every finalizer is detached and
    what would run code as it dies is held for the worker's life (`verifier.run.disarm`): the
    code never runs, and the worker stays.
    """
    attacker, *honest = chain[name]
    assert attacker["outcome"] == "ok", attacker
    for job in honest:
        assert job["outcome"] == "ok" and not job["failure"], job
        assert job["worker_pid"] == attacker["worker_pid"], (job, attacker)


def test_a_logging_handler_a_job_left_does_not_run_in_a_later_job(
        chain: dict[str, list[dict[str, Any]]]) -> None:
    """A job adds a handler to torch's logger. Before (main at 258f195, measured): no finding,
    the same worker, and the next job, which logs a warning through `torch.fx`'s logger, was
    a cheat (the handler rebound torch.relu there). Now every logger's handlers and filters
    are part of the residue: the worker is replaced, the next job runs its own code only."""
    leaver, ask = chain["log"]
    assert any("logging handlers" in m for m in _said(leaver, "worker_replaced")), leaver
    assert ask["worker_pid"] != leaver["worker_pid"]
    assert ask["outcome"] == "runtime_error" and "logged" in ask["error"], ask


def test_an_entry_of_torchs_custom_op_table_a_job_left_is_not_handed_on(
        chain: dict[str, list[dict[str, Any]]]) -> None:
    """A job puts a real `Library` (torch's finalizer, no kernel registered) with a handle whose
    `on_destroy` is its own under "ks_ops::relu" in torch's custom-op table. Before (main at
    258f195, measured): no finding, and the next job, an honest ReLU that defines that op with
    `torch.library.custom_op` (which destroys the old entry's library), was a cheat. Now
    torch's custom-op tables (and the ops torch.library defined) are part of the residue."""
    leaver, honest = chain["opdef"]
    said = " ".join(_said(leaver, "worker_replaced"))
    assert "torch.library registrations" in said, leaver
    assert honest["outcome"] == "ok" and honest["worker_pid"] != leaver["worker_pid"], honest


def test_a_key_of_the_jobs_own_str_class_in_sys_modules_is_not_handed_on(
        chain: dict[str, list[dict[str, Any]]]) -> None:
    """A job puts a key of its own str class, of the hash of "numpy", ahead of "numpy" in
    sys.modules (its value numpy itself, a module imported from a file). Before (main at
    258f195, measured): no finding, the same worker, and the next job, an honest numpy ReLU,
    was a cheat: its `import numpy` ran the key's `__eq__`. Now keys of no exact str in
    sys.modules and in every module's namespace are part of the residue."""
    leaver, honest = chain["shadow"]
    assert any("keys of no str" in m for m in _said(leaver, "worker_replaced")), leaver
    assert honest["outcome"] == "ok" and honest["worker_pid"] != leaver["worker_pid"], honest


def test_an_exit_handler_a_job_left_runs_in_no_later_job(
        chain: dict[str, list[dict[str, Any]]]) -> None:
    """`atexit.register(later)`: it runs only as the worker exits, after its last reply, so no
    later job of the worker meets it (main at 258f195, measured: the same); the worker is not
    replaced for it."""
    leaver, *honest = chain["exit"]
    for job in [leaver, *honest]:
        assert job["outcome"] == "ok" and job["worker_pid"] == leaver["worker_pid"], job


def test_honest_custom_ops_pass_in_consecutive_jobs(
        chain: dict[str, list[dict[str, Any]]]) -> None:
    """Honest ReLUs that register an op (`torch.library.custom_op`, twice under one name; a
    `Library` that defines one, twice), then a plain one: each passes (main: the same; each
    op's registrations replace its worker, as before)."""
    jobs = chain["custom_ops"]
    for job in jobs:
        assert job["outcome"] == "ok" and not job["failure"], job
    for job in jobs[:4]:
        assert any("torch.library registrations" in m for m in _said(job, "worker_replaced"))


def test_a_name_generator_a_job_left_does_not_run_in_a_later_job(
        chain: dict[str, list[dict[str, Any]]]) -> None:
    """A job sets the generator `tempfile` draws names from (the worker's loop makes each
    job's folder with `mkdtemp`) to one of its own class. Before (main at 258f195, measured):
    no finding,
    the same worker, and the next job, an honest numpy ReLU, was a cheat (the generator's
    `choices` rebound torch.relu as the next job's folder was named). Now the globals of
    tempfile and shutil, and their objects' attributes, are part of the residue
    (`tamper.protocol_state`): the worker is replaced."""
    attacker, honest = chain["rng"]
    said = " ".join(_said(attacker, "worker_replaced"))
    assert "tempfile._name_sequence (protocol) attributes" in said, attacker
    assert honest["outcome"] == "ok" and honest["worker_pid"] != attacker["worker_pid"], honest


# a settle as the worker makes them (its ready froze what lived and made the mark), then a job that leaves a `__del__` object frozen by its own `gc.freeze()`; with
# `compensate`, it first lets as many frozen objects die (a cache the harness froze, cleared)
FROZEN = """
import gc, sys
from verifier.run.disarm import note_frozen
from verifier.run.settle import armed_finalizers, leftover_code

cache = [[] for _ in range(200_000)]
gc.collect()
gc.freeze()
mark = note_frozen(freeze=False)  # the worker's loop holds it in a local too
before = armed_finalizers()
ran = []


class Later:
    def __del__(self):
        ran.append(1)


holder = [Later()]
if sys.argv[1] == "compensate":
    cache.clear()
gc.freeze()  # the job's own: its objects leave the collector's lists
leftover_code(before, mark)
holder.clear()
print(len(ran))
"""


def _frozen(how: str) -> str:
    out = subprocess.run([sys.executable, "-c", FROZEN, how], capture_output=True, text=True,
                         cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()[-1]


def test_an_object_a_job_froze_itself_is_pinned_too() -> None:
    """A `__del__` object moved to the collector's permanent generation by the job's own
    `gc.freeze()`, where `gc.get_objects()` does not list it. Before (main at 258f195: no
    object was pinned; this branch's scan of the unfrozen objects alone, measured: not
    pinned), its `__del__` ran when it was dropped after the settle. Now the job's freeze is
    seen (`disarm.frozen_since`: the harness's mark left the listed objects) and the settle
    scans every object (`disarm.pin_mortal`): pinned, it never runs."""
    assert _frozen("plain") == "0"


def test_an_object_a_job_froze_behind_dead_frozen_objects_is_pinned_too() -> None:
    """The same, after clearing a frozen list of 200k lists. Before (main at 264aee6, a strict
    xfail there, measured: `__del__` ran): the freeze was seen by the permanent generation's
    growth past what the harness froze, which the dead lists hid. Now by the harness's mark
    (`disarm.note_frozen`'s), whatever the generation's size: pinned."""
    assert _frozen("compensate") == "0"


@pytest.mark.skipif(sys.version_info < (3, 12), reason="sys.monitoring is new in 3.12")
def test_a_monitoring_tool_a_job_left_is_residue() -> None:
    """A `sys.monitoring` tool whose events a job set (then freed: its events stay in 3.12)
    runs its callback in every later job's Python code: part of the residue (measured with
    3.12.1: named "sys.monitoring")."""
    from verifier.run.tamper import left_in_process, process_state

    before = process_state()
    mon = sys.monitoring
    mon.use_tool_id(4, "ks")
    mon.register_callback(4, mon.events.PY_START, lambda *a: None)
    mon.set_events(4, mon.events.PY_START)
    try:
        assert "sys.monitoring" in left_in_process(before)
    finally:
        mon.set_events(4, 0)
        mon.register_callback(4, mon.events.PY_START, None)
        mon.free_tool_id(4)
