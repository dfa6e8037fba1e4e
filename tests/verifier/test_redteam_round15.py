"""Red-team round 15 on the cpu backend: attacks on branch attack15 (from main at 9c0b911), as a
policy rewarded for holes would try them (cases in tests/verifier/redteam_round15_cases.py).
Each was measured first (the "Before" of each test); an open one is a strict xfail naming its
fix.

Closed here (residue of the persistent worker the residue check did not compare): a C type's
slots repointed under attributes that keep their identity (`c_identity.type_slots`); a thread
of the ready worker ended (a C handler that is `pthread_exit`) and swapped for the job's own,
the count kept (`tamper.NEWEST_THREAD`), and with it OpenBLAS's pool made again in another
floating-point environment and a user and mount namespace of the job's own with a module file
mounted over (`thread_settings.namespaces`: the one-thread process `unshare(CLONE_NEWUSER)`
needs); O_NONBLOCK on the clock pipes (`thread_settings.descriptors`: flags and owner); a
walked registry (a module's names, loggers, the import cache) grown a million-fold, which
slowed every later settle (`tamper.NAMES_SLACK`); ctypes' private `_string_at` rebound to
answer old bytes (every check of C memory reads through it: `tamper.PRIVATE_CALLABLES`); a
rebound function hidden by a sys.modules entry named as its snapshot key (`tamper.MODULE`) or
by a module class whose `__dict__` answers an old copy (`c_identity.namespace`); a proxy
numpy in the interpreter's module dict behind `sys.modules` rebound to a copy.
Held: a reused trial set answered from a cache keyed by its inputs' address.
Open (xfail): the own-kernel share (`--fallback partial` on CUDA) forged through the harness's
own measurement line.
Not tried here: a GPU's device state, the build sandbox (compiles cost minutes on this host).
"""

from __future__ import annotations

from typing import Any

import pytest
from redteam_round7_cases import NUMPY_RELU
from redteam_round15_cases import (
    ADDING_RELU,
    ADDRESS_CACHE,
    BLAS_POOL_UPWARD,
    BLINDED_SLOT,
    MATMUL_TASK,
    MODULE_BLOAT,
    MODULES_COPY,
    NONBLOCKING_CLOCK,
    NUMPY_MATMUL,
    OWN_NAMESPACES,
    QUIET_MODULE,
    SHADOWED_KEY,
    SHARE_FORGED,
    SLOT_ROUTES,
    SWAPPED_THREAD,
    WAVE_IMPORTING_RELU,
    WHERE_RELU,
    leaving,
    slot_attacker,
)
from test_redteam_round14 import _ok, _said, _why  # the rounds' shared readers

pytestmark = pytest.mark.heavy  # out of the default run: CI runs it (-m heavy)


# --- 1. a C type slot repointed under a type whose attributes keep their identity --------------
def test_a_type_slot_a_job_repoints_reaches_no_later_job() -> None:
    """On the real path (`GpuRunner`, cpu loop): an honest numpy ReLU that adds arrays
    (ADDING_RELU, (x + |x|) / 2), the attacker (an honest ReLU leaving NDARRAY_ADD_IS_SUB:
    numpy.ndarray's `tp_as_number->nb_add` pointed at its `nb_subtract` by ctypes), the
    honest ReLU again. Before (attack15 at 9c0b911, measured here): the attacker correct with
    no finding, its worker kept; the later honest ReLU failed by the judge's own check (its
    `a + |a|` a difference: min(x, 0) for relu(x)), nothing run again. Now a type's C slots
    and tables are in its identity (`c_identity.type_slots`: the class walk's classes, and
    builtins', numpy's and torch's types): the attacker's worker is replaced with the finding
    on it, the later job correct."""
    from verifier_cases import cpu_loop_jobs

    outs, _ = cpu_loop_jobs([ADDING_RELU, slot_attacker("ndarray"), ADDING_RELU], "r15slot")
    first, attacker, later = outs
    assert _ok(first) and "replaced" not in _said(first), (_why(first), _said(first))
    assert _ok(attacker), _why(attacker)
    assert "C type slots" in _said(attacker), _said(attacker)
    assert _ok(later), _why(later)


@pytest.mark.parametrize("route", sorted(SLOT_ROUTES))
def test_a_repointed_type_slot_is_residue(route: str) -> None:
    """Each route planted in this process (numpy's static type, torch.Tensor's heap type) is
    residue, and nothing once undone. Before (attack15 at 9c0b911, measured here):
    `left_in_process` empty for both."""
    import ctypes

    import numpy as np
    import torch

    from verifier.run.tamper import left_in_process, process_state

    cls = np.ndarray if route == "ndarray" else torch.Tensor
    word = ctypes.sizeof(ctypes.c_void_p)
    add = ctypes.c_void_p.from_address(ctypes.c_void_p.from_address(id(cls) + 12 * word).value)
    before, was = process_state(), add.value
    try:
        exec(SLOT_ROUTES[route], {})
        assert add.value != was
        left = left_in_process(before)
    finally:
        add.value = was
    after = left_in_process(before)
    left, after = ([x for x in found if x != "file descriptors"] for found in (left, after))
    assert any("C type slots" in x or "torch.Tensor attributes" in x for x in left), left
    assert not after, after


def _runtime(out: Any) -> float:
    return float(((out.clock or {}).get("figures") or {}).get("runtime_us") or 0.0)


# --- 2. a thread of the ready worker swapped for the job's own ---------------------------------
def test_a_thread_swapped_for_the_jobs_own_slows_no_later_sibling() -> None:
    """On the real path (`GpuRunner`, cpu loop): an honest numpy ReLU, the attacker (an honest
    ReLU leaving SWAPPED_THREAD: the ready worker's second thread ended by a SIGUSR2 whose C
    handler is libc's `pthread_exit`, its own `pthread_create`d in its place, which holds the
    GIL from 0.3 s on), an honest ReLU. Before (attack15 at 4d9030c, measured here): no
    finding, the worker kept (two threads, as when ready); the later honest ReLU correct,
    timed at 1397 us a call against 72-167 us before it, nothing run again (or run again
    for its trials' pace, "the judge's windows beat its traced trials", where the hog slowed
    its trials more than its windows). Now the newest thread id is compared too
    (`tamper.NEWEST_THREAD`: ids only grow in the worker's pid namespace): the attacker's
    worker is replaced, the sibling's time its own."""
    from verifier_cases import cpu_loop_jobs

    outs, again = cpu_loop_jobs([NUMPY_RELU, leaving(NUMPY_RELU, SWAPPED_THREAD), NUMPY_RELU],
                                "r15thr")
    first, attacker, later = outs
    assert "native threads (the newest)" in _said(attacker), _said(attacker)
    assert _ok(first) and _ok(attacker) and _ok(later), (_why(first), _why(later))
    assert 0 < _runtime(later) < 3 * _runtime(first) + 100.0, (_runtime(first), _runtime(later))
    assert again == 0 and not later.confirmed, (again, later.confirmed)


# --- 3. a descriptor's flags: the clock pipes not blocking -------------------------------------
def test_clock_pipes_a_job_leaves_non_blocking_fail_no_later_sibling() -> None:
    """On the real path (`GpuRunner`, cpu loop): an honest numpy ReLU, the attacker (an honest
    ReLU leaving NONBLOCKING_CLOCK: O_NONBLOCK on the worker's inherited clock pipes, which
    the harness's per-job `dup` of them shares), two honest ReLUs. Before (attack15 at
    0a9d9b5, measured here): no finding, the worker kept; the next honest ReLU's first run
    failed ("the worker reported runtime_error (BlockingIOError: [Errno 11] ...)") and it was
    run again in a fresh worker (a run's throughput per attack). Now a descriptor's status
    flags and signal owner are compared (`thread_settings.descriptors`): the attacker's
    worker is replaced, the siblings correct at once, nothing run again."""
    from verifier_cases import cpu_loop_jobs

    outs, again = cpu_loop_jobs([NUMPY_RELU, leaving(NUMPY_RELU, NONBLOCKING_CLOCK), NUMPY_RELU,
                                 NUMPY_RELU], "r15nb")
    assert "file descriptors" in _said(outs[1]), _said(outs[1])
    assert all(map(_ok, outs)), [_why(o) for o in outs]
    assert again == 0 and not any(o.confirmed for o in outs), again


def test_a_library_pool_made_again_in_another_environment_reaches_no_later_job() -> None:
    """On the real path (`GpuRunner`, cpu loop, a 256 x 4096 @ 4096 x 256 matmul): an honest
    numpy matmul, the attacker (the same leaving BLAS_POOL_UPWARD: a ready thread ended, then
    OpenBLAS's pool made again at two threads while the main thread rounded upward, the main
    thread's rounding restored), the honest matmul again. Before (attack15 at 4d9030c, the
    count of threads only, measured here): no finding, the worker kept; the later honest
    matmul correct (the judge's matmul tolerance held the upward rounding) but timed at 13012
    us a call against 6180 us before it (two BLAS threads beside the judge on two cores),
    nothing run again. Held now by the newest thread id (`tamper.NEWEST_THREAD`): the
    attacker's worker is replaced, the later job's time its own."""
    from verifier_cases import cpu_loop_jobs

    outs, again = cpu_loop_jobs([NUMPY_MATMUL, leaving(NUMPY_MATMUL, BLAS_POOL_UPWARD),
                                 NUMPY_MATMUL], "r15blas", task=MATMUL_TASK)
    first, attacker, later = outs
    assert "native threads (the newest)" in _said(attacker), _said(attacker)
    assert all(map(_ok, outs)), [_why(o) for o in outs]
    assert 0 < _runtime(later) < 1.6 * _runtime(first), (_runtime(first), _runtime(later))
    assert again == 0


# --- 4. the own-kernel share, forged through the harness's own measurement line ---------------
def test_the_own_kernel_share_is_not_the_candidates_to_choose() -> None:
    """On the real path (`GpuRunner`, cpu loop): an honest numpy ReLU, then SHARE_FORGED (the
    same, whose first trial call wraps its JobResult's `on_measure` so that the harness's own
    measurement line says `own_share` 1.0). Measured (attack15 at 18bf22e): the honest run's
    share None (not measured on cpu), the forger's 1.0: the parent's copy
    (`RunOutcome.own_share`, which `stages.record_measurements` puts in the verdict's reward
    components), no finding. On CUDA under the partial policy that was a library-bound run's
    speed reward in full. Nothing in that process can make the share safe, so it no longer
    scales the reward (`verifier.judge.reward`): the forger's verdict, its forged share in
    its components, gets the very reward of the same verdict with no share, under both
    policies; the share stays a diagnostic."""
    from verifier_cases import cpu_loop_jobs

    from verifier.judge.reward import record_share, reward_of
    from verifier.protocol import VerdictData

    outs, _ = cpu_loop_jobs([NUMPY_RELU, SHARE_FORGED], "r15share")
    honest, forger = outs
    assert _ok(honest) and _ok(forger), (_why(honest), _why(forger))
    assert honest.own_share is None
    assert forger.own_share == 1.0, forger.own_share  # the attack reached the line
    for speedup in (0.05, 0.9, 2.5):  # a library-bound kernel's share would be ~0
        plain, forged = (VerdictData(candidate_id="c", task_id="t", status="correct_slow",
                                     stage="performance", backend="cuda", speedup=speedup)
                         for _ in range(2))
        record_share(plain, 0.02, 1)
        record_share(forged, forger.own_share, 1)
        for policy in ("strict", "partial"):
            got, comps = reward_of(forged, policy)
            assert got == reward_of(plain, policy)[0], (speedup, policy)
            assert comps["own_share"] == 1.0  # kept, as the worker said it


# --- 5. a module namespace made huge: every later settle slower -----------------------------
def test_a_namespace_a_job_bloats_slows_no_later_settle() -> None:
    """On the real path (`GpuRunner`, cpu loop): two honest numpy ReLUs, the attacker (an
    honest ReLU leaving MODULE_BLOAT: a million names in `os`), two honest ReLUs. Before
    (attack15 at facf07d, measured here): no finding, the worker kept; the honest jobs took
    0.66 and 0.73 s each before it and 2.93 and 3.48 s after it (each settle walks the names):
    a worker's throughput a quarter, for its life. Now a module of the ready worker that
    gained more than `tamper.NAMES_SLACK` names is residue: the attacker's worker is replaced,
    the later jobs run in a fresh one."""
    from verifier_cases import cpu_loop_jobs

    outs, again = cpu_loop_jobs([NUMPY_RELU, NUMPY_RELU, leaving(NUMPY_RELU, MODULE_BLOAT),
                                 NUMPY_RELU, NUMPY_RELU], "r15bloat")
    assert "os (names)" in _said(outs[2]), _said(outs[2])
    assert all(map(_ok, outs)), [_why(o) for o in outs]
    pids = [(o.payload or {}).get("worker_pid") for o in outs]
    assert pids[2] == pids[0] and pids[3] == pids[4] != pids[2], pids
    assert again == 0


@pytest.mark.parametrize("route", ["module", "loggers", "importer_cache"])
def test_a_walked_registry_a_job_bloats_is_residue(route: str) -> None:
    """Each registry the settle walks, grown past `tamper.NAMES_SLACK` in this process (a
    module's names, `logging`'s loggers, `sys.path_importer_cache`'s None entries for paths
    that are no directory: none of their new entries is compared), is residue, and nothing
    once undone. Before (attack15 at facf07d, measured here): `left_in_process` empty for
    each; 300k loggers (127 MB) made each settle's walk 0.17 s slower, and a million None
    entries cost an `os.stat` each."""
    import logging
    import sys

    from verifier.run.tamper import NAMES_SLACK, left_in_process, process_state

    names = [f"ks_r15_{i}" for i in range(NAMES_SLACK + 10)]
    where = {"module": vars(sys.modules["os"]), "loggers": logging.Logger.manager.loggerDict,
             "importer_cache": sys.path_importer_cache}[route]
    before = process_state()
    try:
        for name in names:
            if route == "loggers":
                logging.getLogger(name)
            else:
                where[name if route == "module" else f"/nonexistent/{name}"] = None
        left = left_in_process(before)
    finally:
        for name in names:
            where.pop(f"/nonexistent/{name}" if route == "importer_cache" else name, None)
    after = left_in_process(before)
    left, after = ([x for x in found if x != "file descriptors"] for found in (left, after))
    assert any(x.endswith("(names)") for x in left), left
    assert not after, after


# --- 6. a user and mount namespace of the job's own: a module file mounted over ---------------
def test_a_module_a_job_mounts_over_runs_in_no_later_job() -> None:
    """On the real path (`GpuRunner`, cpu loop): an honest numpy ReLU, the attacker (an honest
    ReLU leaving OWN_NAMESPACES: the worker's second thread ended, `unshare(CLONE_NEWUSER |
    CLONE_NEWNS)` (a single-threaded process may), its file bind-mounted over the standard
    library's `wave.py`), then an honest ReLU that imports `wave` (not loaded in a ready
    worker). Before (attack15 at a310abd, measured here): the attacker correct with no finding,
    its worker kept (in its own namespaces); the later honest ReLU "trial 1, checked by the
    verifier itself: output 0: 65536 of 65536 elements differ ...: got 1, expected 0" (the
    mounted file's `np.maximum` plus one), a failure that stands, nothing run again, the
    residue found on the honest job. Now the namespaces and the mount table are compared
    (`thread_settings.namespaces`): the attacker's worker is replaced, the later job correct."""
    from verifier_cases import cpu_loop_jobs

    outs, again = cpu_loop_jobs([NUMPY_RELU, leaving(NUMPY_RELU, OWN_NAMESPACES),
                                 WAVE_IMPORTING_RELU], "r15ns")
    first, attacker, later = outs
    assert "namespaces and mounts" in _said(attacker), _said(attacker)
    assert all(map(_ok, outs)), [_why(o) for o in outs]
    assert "replaced" not in _said(later) and again == 0, (_said(later), again)


# --- 7. the residue check's reader blinded ---------------------------------------------------
def test_a_slot_hidden_from_the_checks_reader_reaches_no_later_job() -> None:
    """On the real path (`GpuRunner`, cpu loop): ADDING_RELU, the attacker (an honest ReLU
    leaving BLINDED_SLOT: numpy.ndarray's `nb_add` at its `nb_subtract`, and `ctypes._string_at`
    rebound to answer the table's old bytes), ADDING_RELU. Before (attack15 at the type-slot
    fix, measured here): the attacker correct with no finding, the later honest ReLU "trial 1,
    checked by the verifier itself: output 0: 65527 of 65536 elements differ ...", nothing run
    again. Now ctypes' private callables and its classes' attributes are compared
    (`tamper.PRIVATE_CALLABLES`, `tamper.CLASS_MODULES`: a rebound reader is residue itself,
    read without ctypes): the attacker's worker is replaced, the later job correct."""
    from verifier_cases import cpu_loop_jobs

    outs, again = cpu_loop_jobs([ADDING_RELU, leaving(NUMPY_RELU, BLINDED_SLOT), ADDING_RELU],
                                "r15blind")
    assert "ctypes._string_at" in _said(outs[1]), _said(outs[1])
    assert all(map(_ok, outs)), [_why(o) for o in outs]
    assert again == 0


# --- 8. a reused trial set answered from a cache keyed by its inputs' address ----------------
def test_a_reused_trial_set_answered_from_a_cache_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the persistent worker's loop with a trial arena of one set (RELU_TASK, as
    tests/verifier/test_trial_reuse.py): ADDRESS_CACHE answers the paced trial on the reused
    set with the output it kept under that set's address, then an honest ReLU. Measured
    (attack15 at 5ebf0bd): held: the reused set is drawn again and its slot poisoned at the
    trial's "p" (`TrialJudge._publish_again`), so the kept output is wrong for the fresh
    inputs: "trial 2, checked by the verifier itself", at "t" (no window served); the honest
    job after it correct."""
    from test_trial_reuse import ONE_SET
    from verifier_cases import RELU_TASK, cpu_loop_jobs

    from verifier.run import gpu_runner

    monkeypatch.setattr(gpu_runner, "CPU_TRIALS_BYTES", ONE_SET)
    (cacher, honest), _ = cpu_loop_jobs([ADDRESS_CACHE, NUMPY_RELU], "r15reuse", task=RELU_TASK)
    ok, why = cacher.referee("run", {}) if cacher.referee else (None, cacher.payload)
    assert ok is False and str(why).startswith("trial 2, checked by the verifier itself"), why
    assert cacher.clock["trials"][0] is False and not cacher.clock["figures"], cacher.clock
    assert _ok(honest), _why(honest)


# --- 9. a rebound function's snapshot key written over by a sys.modules entry ----------------
def test_a_rebinding_hidden_under_a_module_entrys_key_reaches_no_later_job() -> None:
    """On the real path (`GpuRunner`, cpu loop): an honest numpy ReLU by `np.where`, the
    attacker (an honest ReLU leaving SHADOWED_KEY: `numpy.where` rebound to add 1, and the
    original function put in sys.modules as "numpy.where"), the `np.where` ReLU again. Before
    (attack15 at c2e5e7d, measured here): the attacker correct with no finding (the entry's
    key, its name, is the key of `numpy.where`: walked after numpy, it wrote the original's
    identity over it; and its name was in the snapshot, so no new module either), the later
    honest ReLU "trial 1, checked by the verifier itself: ... got 1, expected 0", nothing run
    again. Now a module is keyed as "<name> (module)" (`tamper.MODULE`): the rebinding and the
    entry are residue, the attacker's worker is replaced, the later job correct."""
    from verifier_cases import cpu_loop_jobs

    outs, again = cpu_loop_jobs([WHERE_RELU, leaving(NUMPY_RELU, SHADOWED_KEY), WHERE_RELU],
                                "r15key")
    assert "numpy.where" in _said(outs[1]), _said(outs[1])
    assert all(map(_ok, outs)), [_why(o) for o in outs]
    assert again == 0



def test_a_rebinding_hidden_behind_a_modules_class_reaches_no_later_job() -> None:
    """The same with QUIET_MODULE: `numpy.where` rebound and numpy's class set to a ModuleType
    subclass whose `__dict__` property answers a copy taken before. Before (attack15 at
    fc3458e, measured here): the attacker correct with no finding (every walk read
    `vars(numpy)`: the copy), the later honest ReLU "trial 1, checked by the verifier itself:
    ... got 1, expected 0", nothing run again. Now the walks read a module's or a class's own
    namespace (`c_identity.namespace`) and a module's key holds its class: the attacker's
    worker is replaced, the later job correct."""
    from verifier_cases import cpu_loop_jobs

    outs, again = cpu_loop_jobs([WHERE_RELU, leaving(NUMPY_RELU, QUIET_MODULE), WHERE_RELU],
                                "r15quiet")
    assert "numpy.where" in _said(outs[1]) and "numpy (module)" in _said(outs[1]), _said(outs[1])
    assert all(map(_ok, outs)), [_why(o) for o in outs]
    assert again == 0



def test_a_proxy_module_behind_a_copy_of_sys_modules_reaches_no_later_job() -> None:
    """On the real path (`GpuRunner`, cpu loop): an honest numpy ReLU, the attacker (an honest
    ReLU leaving MODULES_COPY: `sys.modules` rebound to a copy, a proxy of numpy whose
    `maximum` adds 1 put in the interpreter's own module dict), an honest ReLU. Before
    (attack15 at 015b094, measured here): the attacker correct with no finding (every check
    read the copy), the later honest ReLU's `import numpy` got the proxy: "trial 1, checked by
    the verifier itself: ... got 2.46619, expected 1.46619", nothing run again. Now the
    `sys.modules` object is compared (`tamper.process_settings`): the attacker's worker is
    replaced, the later job correct."""
    from verifier_cases import cpu_loop_jobs

    outs, again = cpu_loop_jobs([NUMPY_RELU, leaving(NUMPY_RELU, MODULES_COPY), NUMPY_RELU],
                                "r15mods")
    assert "sys.modules (object)" in _said(outs[1]), _said(outs[1])
    assert all(map(_ok, outs)), [_why(o) for o in outs]
    assert again == 0
