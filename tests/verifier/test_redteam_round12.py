"""Red-team round 12 on the cpu backend: attacks on branch attack12 at 160fc37, as a policy
rewarded for holes would try them (cases in tests/verifier/redteam_round12_cases.py). Each was
measured first (the "Before" of each test); an open one is a strict xfail naming its fix.

Closed in session 18 (main after 96c4477): every residue route below is compared now
(`verifier.run.tamper.interpreter_private`: the private callables of builtins, warnings and
importlib's bootstrap, `warnings.filters` by value, the finders of `sys.path_importer_cache`,
torch's global module hooks): the job that leaves one has its worker replaced, with the
finding on it, and no later job meets its code; the tests below assert that. Closed in
session 19: a new or None entry of `sys.path_importer_cache` (`verifier.run.import_residue`),
and the two trial-pace holes at the end (stepped trials, at least `trial_pace.PACED_TRIALS`
paced).

Routes by which one job of a persistent worker (`verifier.run.gpu_worker`, its cpu loop here)
runs its code in a later job, an honest sibling's, that the residue check
(`verifier.run.tamper.process_state`) does not compare: it compares every loaded module's
*public* callables by identity, and `builtins.__import__` by name, but
- `builtins.__build_class__` (called by every `class` statement, the next job's `class
  ModelNew` too) is a private name: a job that rebinds it wraps every later job's model. On
  the real path (`GpuRunner`: the judge's arena, `confirmed`) the sibling's outputs are wrong
  in its trials and its timed windows: the judge established both, so nothing is run again,
  and the honest sibling is a cheat (the timed call's wrong output), reward 0;
- `warnings.filters` is a list changed in place (its identity stays): a filter whose message
  pattern is the job's own object has its `match` called at every later warning, and
  `simplefilter("error")` turns an honest sibling's warning into its runtime error;
- `warnings._showwarnmsg` (what the C `warn` calls to show one) is private too; the public
  `warnings.showwarning` is compared (caught: the worker is replaced);
- `importlib._bootstrap._find_and_load` (what the interpreter calls at every import of a module
  not yet loaded) is private: a job's wrapper runs at a later job's `import`; and
  `sys.path_importer_cache` is a dict changed in place: a job's own finder for the standard
  library's directory answers a later job's import from there;
- torch's global module forward hooks (`torch.nn.modules.module._global_forward_hooks`, a
  private dict changed in place) run at every later `ModelNew` call and replace its output:
  through the public `register_module_forward_hook` it is caught by chance (the handle class's
  counter, `RemovableHandle.next_id`, is a class attribute the check compares), put in the dict
  directly nothing sees it, and every later honest job of the worker is wrong (on the real
  path: wrong trials and timed windows, the judge's own failures, nothing run again).
The static checks reject most plain forms (`import builtins`, `builtins.__build_class__ = `,
`torch.nn.modules`, and the C API a compiled candidate would run them with: measured on
verify_batch), so, as in rounds 9-11, each is planted by code that passed them
(`test_redteam_round9._leaving`: the model's `__del__`, after the job's own checks) and what
is tested is the runtime layer. Not `import warnings; warnings.simplefilter("error")` at a
candidate's module level: the static checks pass it, and end to end (`verify_batch`, the
persistent cpu loop) the attacker is correct with no finding while a later sibling that warns
fails in its worker and is saved only by its fresh-worker re-run (`outcome.confirmed`). Nor
an "always" filter inserted and `warnings._showwarnmsg` assigned a function that sleeps: a
later honest sibling that warns in forward is timed 180x slower (30 us -> 5407 us a call,
reward 0.553 -> 0.500), with no failure anywhere for a re-run to undo (open).

The judge's clock over the trials (`verifier.judge.trial_pace`, the persistent loop's only
check that the timed calls ran what the traced trials ran): every trial's inputs are in the
judge's arena from the start, so a run whose timed calls run the library (round 10's blinded
recorder) computes every trial's output with its own slow kernel in the first trial, which the
rule does not count, and returns each at once in the later ones: its trials look as fast as a
copy, and it is timed at the library's speed with no finding. And with `trials=2` (an
operator's option) only one trial is past the uncounted first, fewer than the rule needs: it
is off, and round 10's blinded run itself passes. Both closed: the trials are stepped (each
trial's inputs published at its "p", its slot sealed at its "q") and a paced job has at least
three trials (`verifier.judge.trial_pace`).

GPU form: with `KS_REDTEAM_WORKER_BACKEND=cuda` on a GPU host the job loops (the chain, round 9's
`_jobs`; the real path, `verifier_cases.cpu_loop_jobs`) run in a CUDA worker, the numpy
attackers in their cuda form (`redteam_round7_cases.on_worker_device`); the `verify_batch`
cases of compiled cpu (C++) candidates are skipped there (`CPU_BATCH`).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from verifier_cases import LOOP_BACKEND, skip_without_worker_device  # noqa: E402

skip_without_worker_device()
from redteam_round7_cases import NUMPY_RELU  # noqa: E402
from redteam_round10_cases import BLIND_EXTRA, BLIND_FORWARD  # noqa: E402
from redteam_round12_cases import (  # noqa: E402
    BUILD_CLASS,
    BUILD_CLASS_WRONG,
    FIND_AND_LOAD,
    GLOBAL_HOOK,
    GLOBAL_HOOK_DIRECT,
    IMPORTING_RELU,
    PATH_CACHE,
    PRECOMPUTE_EXTRA,
    PRECOMPUTE_FORWARD,
    PRECOMPUTE_THERE_EXTRA,
    SHOWWARNING,
    SHOWWARNMSG,
    SLOW_WARNINGS_EXTRA,
    WARN_ERROR,
    WARN_MATCH,
    WARNING_RELU,
)
from test_redteam_round9 import _jobs, _leaving, _said  # noqa: E402

from verifier.run.tamper import left_in_process, process_state  # noqa: E402

pytestmark = pytest.mark.heavy  # out of the default run: CI runs it (-m heavy)

RESIDUE_FIX = ("compare the private callables of `builtins` (at least `__build_class__`), "
               "`warnings` (`_showwarnmsg`) and `importlib._bootstrap` (`_find_and_load`), "
               "and `warnings.filters`, `sys.path_importer_cache` and torch's global module "
               "hooks by value, in "
               "`tamper.process_state`")

# the `verify_batch` cases: a batch of compiled C++ ReLUs on the cpu backend, whatever the loop's
# backend (their GPU form would be CUDA candidates on the cuda backend: not written)
CPU_BATCH = pytest.mark.skipif(LOOP_BACKEND != "cpu", reason=(
    "a verify_batch of compiled cpu (C++) candidates on the cpu backend: it does not run in the "
    "cuda worker; it runs in the cpu suite (no CUDA form written)"))


@pytest.fixture(scope="module")
def chain() -> dict[str, list[dict[str, Any]]]:
    """Each attack and the jobs after it, in one worker's sequence (a job that ends its worker
    starts the next one), without `confirmed`: what the residue checks alone do."""
    runs = {"honest_warns": [WARNING_RELU, WARNING_RELU],
            "build": [NUMPY_RELU, _leaving(BUILD_CLASS), NUMPY_RELU, NUMPY_RELU],
            "match": [_leaving(WARN_MATCH), WARNING_RELU],
            "error": [_leaving(WARN_ERROR), WARNING_RELU],
            "showwarning": [_leaving(SHOWWARNING), WARNING_RELU],
            "showwarnmsg": [_leaving(SHOWWARNMSG), WARNING_RELU],
            "path_cache": [_leaving(PATH_CACHE), IMPORTING_RELU],
            "find": [NUMPY_RELU, _leaving(FIND_AND_LOAD), IMPORTING_RELU],
            "hook": [_leaving(GLOBAL_HOOK), NUMPY_RELU],
            "hook_direct": [_leaving(GLOBAL_HOOK_DIRECT), NUMPY_RELU, NUMPY_RELU]}
    got = _jobs([src for srcs in runs.values() for src in srcs])
    out, i = {}, 0
    for name, srcs in runs.items():
        out[name], i = got[i:i + len(srcs)], i + len(srcs)
    return out


def test_an_honest_job_that_warns_passes_in_consecutive_jobs(
        chain: dict[str, list[dict[str, Any]]]) -> None:
    """The control of the warnings attacks: WARNING_RELU (a numpy ReLU that warns) passes,
    twice in one worker, with no finding."""
    first, second = chain["honest_warns"]
    for job in (first, second):
        assert job["outcome"] == "ok" and not job["failure"], job
        assert not _said(job, "worker_replaced") and not _said(job, "patched_function"), job
    assert first["worker_pid"] == second["worker_pid"]


def _clean(leaver: dict[str, Any], after: list[dict[str, Any]]) -> None:
    """The attacker ran its own job to the end, and no later job met its code: each later job
    is ok (not the cheat `later()` makes of the job it runs in)."""
    assert leaver["outcome"] == "ok", leaver
    for job in after:
        assert job["outcome"] == "ok" and not job["failure"], (job, leaver)


def test_a_class_builder_a_job_left_runs_in_no_later_job(
        chain: dict[str, list[dict[str, Any]]]) -> None:
    """Before (measured here): the attacker "ok" with no finding, the next honest numpy ReLU
    in the same worker a cheat ("torch.relu changed during the run": the wrapper ran at its
    `class ModelNew`), the one after it ok in a new worker."""
    honest0, leaver, *after = chain["build"]
    assert honest0["outcome"] == "ok", honest0
    _clean(leaver, after)


def test_a_warnings_filter_a_job_left_runs_in_no_later_job(
        chain: dict[str, list[dict[str, Any]]]) -> None:
    """Before (measured here): the attacker "ok", the same worker, and the next job, an honest
    ReLU that warns, a cheat ("torch.relu changed during the run")."""
    leaver, honest = chain["match"]
    _clean(leaver, [honest])


def test_warnings_made_errors_by_a_job_do_not_fail_a_later_job(
        chain: dict[str, list[dict[str, Any]]]) -> None:
    """Before (measured here): the attacker "ok", the same worker, and the next job, an honest
    ReLU that warns: "runtime_error: candidate.py line 8: RuntimeWarning: ks-honest: the numpy
    path" (`confirmed` makes it again in a fresh worker: it costs the sibling a second run)."""
    leaver, honest = chain["error"]
    _clean(leaver, [honest])


def test_the_public_showwarning_a_job_rebinds_is_residue(
        chain: dict[str, list[dict[str, Any]]]) -> None:
    """Caught: `warnings.showwarning` rebound is a public callable of a loaded module: the
    attacker's worker is replaced (measured: a new pid, the finding names it), and the next
    job, an honest ReLU that warns, passes (the rebinding never ran in it)."""
    leaver, honest = chain["showwarning"]
    said = " ".join(_said(leaver, "worker_replaced"))
    assert "warnings.showwarning" in said, leaver
    assert honest["worker_pid"] != leaver["worker_pid"], (honest, leaver)
    _clean(leaver, [honest])


def test_the_private_showwarnmsg_a_job_rebinds_runs_in_no_later_job(
        chain: dict[str, list[dict[str, Any]]]) -> None:
    """Before (measured here): the attacker "ok", the same worker, the next job (an honest ReLU
    that warns) a cheat ("torch.relu changed during the run")."""
    leaver, honest = chain["showwarnmsg"]
    _clean(leaver, [honest])


def test_an_import_function_a_job_rebinds_runs_in_no_later_job(
        chain: dict[str, list[dict[str, Any]]]) -> None:
    """Before (measured here): the attacker "ok" with no finding, the same worker, and the
    next job, an honest ReLU that imports `tabnanny` (no job did before), a cheat ("torch.relu
    changed during the run")."""
    honest0, leaver, importer = chain["find"]
    assert honest0["outcome"] == "ok", honest0
    _clean(leaver, [importer])


def test_a_finder_a_job_put_in_the_path_importer_cache_runs_in_no_later_job(
        chain: dict[str, list[dict[str, Any]]]) -> None:
    """Before (measured here): the attacker "ok" with no finding, the same worker, and the
    next job, an honest ReLU that imports `tabnanny`, a cheat ("torch.relu changed during the
    run")."""
    leaver, importer = chain["path_cache"]
    _clean(leaver, [importer])


def test_a_global_forward_hook_registered_through_torch_is_residue(
        chain: dict[str, list[dict[str, Any]]]) -> None:
    """Caught (by chance): `register_module_forward_hook` makes a `RemovableHandle`, whose
    class counter is a class attribute the residue check compares: the attacker's worker is
    replaced (measured: "torch.utils.hooks.RemovableHandle attributes changed"), and the next
    honest job passes (the hook never ran in it)."""
    leaver, honest = chain["hook"]
    said = " ".join(_said(leaver, "worker_replaced"))
    assert "RemovableHandle" in said, leaver
    assert honest["worker_pid"] != leaver["worker_pid"], (honest, leaver)
    _clean(leaver, [honest])


def test_a_global_forward_hook_put_in_torchs_dict_runs_in_no_later_job(
        chain: dict[str, list[dict[str, Any]]]) -> None:
    """Before (measured here): the attacker "ok" with no finding, and both later honest
    numpy ReLUs in the same worker "incorrect" ("output 0: 65536 of 65536 elements differ
    ...: got 1, expected 0")."""
    leaver, *after = chain["hook_direct"]
    _clean(leaver, after)


# --- the residue check, in process -------------------------------------------------------------
def test_the_residue_check_names_a_rebound_showwarning() -> None:
    """The caught form at unit level: `left_in_process` names `warnings.showwarning`."""
    before = process_state()
    saved = warnings.showwarning
    warnings.showwarning = lambda *a, **k: None
    try:
        assert "warnings.showwarning" in left_in_process(before)
    finally:
        warnings.showwarning = saved


@pytest.mark.parametrize("route", ["build_class", "showwarnmsg", "filters", "find_and_load",
                                   "global_hook", "path_importer_cache"])
def test_the_residue_check_names_each_route(route: str) -> None:
    """Each route changed in this process: `left_in_process` said nothing (measured). The
    importer cache's route: a new entry of None for a directory (hidden from every later
    import; a new entry was not compared, `verifier.run.import_residue` judges it now)."""
    import builtins
    import tempfile
    from importlib import _bootstrap

    from torch.nn.modules import module

    probe = tempfile.mkdtemp(prefix="ks-probe-")
    before = process_state()
    saved = (builtins.__build_class__, warnings._showwarnmsg, list(warnings.filters),
             _bootstrap._find_and_load)
    try:
        if route == "build_class":
            build = builtins.__build_class__
            builtins.__build_class__ = lambda *a, **k: build(*a, **k)
        elif route == "showwarnmsg":
            warnings._showwarnmsg = lambda msg: None  # type: ignore[attr-defined]
        elif route == "filters":
            warnings.filterwarnings("error", message="ks-probe")
        elif route == "find_and_load":
            find = _bootstrap._find_and_load
            _bootstrap._find_and_load = lambda *a, **k: find(*a, **k)
        elif route == "global_hook":
            module._global_forward_hooks[-7] = lambda *a: None
        else:
            sys.path_importer_cache[probe] = None
        assert left_in_process(before), route
    finally:
        sys.path_importer_cache.pop(probe, None)
        Path(probe).rmdir()
        module._global_forward_hooks.pop(-7, None)
        _bootstrap._find_and_load = saved[3]
        builtins.__build_class__, warnings._showwarnmsg = saved[:2]  # type: ignore[attr-defined]
        warnings.filters[:] = saved[2]
        warnings._filters_mutated()  # type: ignore[attr-defined]


# --- the real path: a framed sibling is a cheat, nothing run again -----------------------------
def _runner(sources: list[str]) -> tuple[list[Any], int]:
    """One `GpuRunner` (cpu loop), a job per source: the outcomes, runs made again."""
    from verifier_cases import cpu_loop_jobs

    return cpu_loop_jobs(sources, "r12")


@pytest.mark.parametrize("attack", ["build_class", "global_hook"])
def test_code_a_job_left_does_not_make_honest_siblings_cheats(attack: str) -> None:
    """An honest numpy ReLU, the attacker (BUILD_CLASS_WRONG: its `__build_class__` gives
    every later ModelNew a forward that adds 1 to its output through numpy; GLOBAL_HOOK_DIRECT:
    a global forward hook that does the same), two honest ones. Before (measured here, each):
    the attacker's trials right and its windows clean; each later honest job's trials wrong by
    the judge ("trial 1, checked by the verifier itself: output 0: 65536 of 65536 elements
    differ") and its timed call's output wrong (the clock's `failure`: a cheat), no run made
    again (`confirmations` 0)."""
    code = {"build_class": BUILD_CLASS_WRONG, "global_hook": GLOBAL_HOOK_DIRECT}[attack]
    outs, again = _runner([NUMPY_RELU, _leaving(code), NUMPY_RELU, NUMPY_RELU])
    honest0, attacker, *after = outs
    for out in (honest0, attacker):  # the attack is invisible in its own job
        assert out.referee is not None and out.referee("run", {})[0], out.payload
        assert (out.clock or {}).get("failure") == "", out.clock
    for out in after:
        assert out.referee is not None and out.referee("run", {})[0], (
            out.referee("run", {}), again)
        assert (out.clock or {}).get("failure") == "", out.clock


# --- the judge's clock over the trials: every output computed in the uncounted trial ------------
@pytest.fixture(scope="module")
def paced(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One batch on the persistent worker's cpu loop (the static checks off, as round 10's
    blinded run is tested): an honest unoptimised ReLU (its kernel several times slower than
    torch.relu), round 10's blinded run over it, the blinded run that computes every trial's
    output ahead (PRECOMPUTE_EXTRA), and the same run computing ahead only the trials whose
    inputs are in the arena (PRECOMPUTE_THERE_EXTRA: stepped trials publish each at its "p")."""
    from redteam_cases import RELU, candidate
    from verifier_cases import relu_task

    import verifier.stages as stages
    from verifier.api import verify_batch
    from verifier.backends.cpu import CpuBackend
    from verifier.protocol import VerifyOptions, VerifyRequest

    base = tmp_path_factory.mktemp("paced")
    slow = RELU.replace("for (int64_t i = 0;",
                        "for (int pass = 0; pass < 4; ++pass)\n    for (int64_t i = 0;")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(stages, "check_python", lambda *a, **k: [])
        mp.setattr(stages, "check_cpp", lambda *a, **k: [])
        mp.setattr(CpuBackend, "persistent_worker", True)
        kw = {"cpp": slow, "cflags": '["-O0"]', "name": "r12_slow", "prelude": False}
        rows = [("honest", candidate(**kw)),
                ("blind", candidate(BLIND_EXTRA, forward=BLIND_FORWARD, **kw)),
                ("ahead", candidate(BLIND_EXTRA + PRECOMPUTE_EXTRA, forward=PRECOMPUTE_FORWARD,
                                    **kw)),
                ("there", candidate(BLIND_EXTRA + PRECOMPUTE_THERE_EXTRA,
                                    forward=PRECOMPUTE_FORWARD, **kw))]
        reqs = [VerifyRequest(n, "relu", relu_task(256, 4096), c, "cpu") for n, c in rows]
        got = verify_batch(reqs, VerifyOptions(
            backend="cpu", gpus=1, workers=1, build_cache_dir=str(base / "builds"),
            baseline_cache_dir=str(base / "baselines")))
    return {v.candidate_id: v for v in got}


@CPU_BATCH
def test_the_blinded_run_over_a_slow_kernel_is_still_caught_by_the_trials_pace(
        paced: dict[str, Any]) -> None:
    """The control: the honest slow kernel is correct; round 10's blinded run over it is a
    cheat (`timed_not_traced`; measured here: windows 2307 us a call, trials 35592 us). Its
    first run, in a worker that ran the honest job, was made again in a fresh worker
    (`outcome.retimed`: the host's load is no cheat), and the second draw caught it too: the
    re-run is no re-roll for a run that switches kernels every time."""
    honest = paced["honest"]  # default trials (5): correct, nothing held against its windows
    assert honest.status.startswith("correct"), honest
    assert not {"timed_not_traced", "trials_admitted"} & {f["rule"] for f in honest.findings}
    blind = paced["blind"]
    assert blind.status == "cheat", blind
    rules = {f["rule"] for f in blind.findings}
    assert {"timed_not_traced", "confirmed_fresh"} <= rules, blind.findings


@CPU_BATCH
def test_a_blinded_run_that_computes_its_trials_ahead_is_caught(paced: dict[str, Any]) -> None:
    """Before (measured here): "ahead" correct_slow with no finding, timed at 2374 us a call
    (torch.relu's speed; its own kernel, the honest run: 32974 us), reward 0.557 against the
    honest kernel's 0.504; the same run without the precompute is the cheat above. Now the
    trials are stepped (`verifier.judge.trial_pace`): the later trials' inputs are the judge's
    poison during the first, so "ahead" returns outputs of the poison and its trial 2 is wrong
    (the judge's own check); the run that computes ahead only what the arena holds ("there")
    computes each trial in its own trial, and its trials are timed as the blinded run's are."""
    ahead = paced["ahead"]
    assert ahead.status == "incorrect", (ahead.status, ahead.error, ahead.findings)
    assert "trial 2" in ahead.error, ahead.error
    there = paced["there"]
    assert there.status == "cheat", (there.status, there.runtime_us, there.findings)
    assert "timed_not_traced" in {f["rule"] for f in there.findings}, there


@CPU_BATCH
def test_a_blinded_run_with_two_trials_is_caught(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Round 10's blinded run over the slow kernel, as `paced` runs it (there: trials=5, a
    cheat), with `VerifyOptions(trials=2)`, beside the honest slow kernel. Before (measured
    here, twice): correct_slow and correct_fast, no finding, timed at 2443 and 2288 us a call
    (torch.relu's speed; trials=3 on the same host: a cheat at 58.6x, trials 44692 us). Now a
    paced job has at least `trial_pace.PACED_TRIALS` (3) trials whatever it asks: the blinded
    run is a cheat, the honest one correct with no finding."""
    from redteam_cases import RELU, candidate
    from verifier_cases import relu_task

    import verifier.stages as stages
    from verifier.api import verify_batch
    from verifier.backends.cpu import CpuBackend
    from verifier.protocol import VerifyOptions, VerifyRequest

    monkeypatch.setattr(stages, "check_python", lambda *a, **k: [])
    monkeypatch.setattr(stages, "check_cpp", lambda *a, **k: [])
    monkeypatch.setattr(CpuBackend, "persistent_worker", True)
    slow = RELU.replace("for (int64_t i = 0;",
                        "for (int pass = 0; pass < 4; ++pass)\n    for (int64_t i = 0;")
    kw = {"cpp": slow, "cflags": '["-O0"]', "name": "r12_slow", "prelude": False}
    src = candidate(BLIND_EXTRA, forward=BLIND_FORWARD, **kw)
    honest, got = verify_batch(
        [VerifyRequest(n, "relu", relu_task(256, 4096), c, "cpu")
         for n, c in (("honest2", candidate(**kw)), ("blind2", src))],
        VerifyOptions(backend="cpu", gpus=1, workers=1, trials=2,
                      build_cache_dir=str(tmp_path / "builds"),
                      baseline_cache_dir=str(tmp_path / "baselines")))
    assert got.status == "cheat", (got.status, got.runtime_us, got.findings)
    assert "timed_not_traced" in {f["rule"] for f in got.findings}, got
    assert honest.status.startswith("correct"), honest
    assert not {"timed_not_traced", "trials_admitted"} & {f["rule"] for f in honest.findings}


# --- end to end: the warnings filter from a candidate that passes the static checks -------------
@pytest.fixture(scope="module")
def warned(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One batch through `verify_batch` on the persistent worker's cpu loop, static checks on:
    the attacker (a compiled ReLU with `import warnings; warnings.simplefilter('error')` at
    module level: the static checks pass it, measured), an honest ReLU that warns in forward,
    an honest one."""
    from redteam_cases import candidate
    from verifier_cases import relu_task

    from verifier.api import verify_batch
    from verifier.backends.cpu import CpuBackend
    from verifier.protocol import VerifyOptions, VerifyRequest

    base = tmp_path_factory.mktemp("warned")
    warner = candidate(extra="import warnings\n", forward=(
        "warnings.warn('ks-honest: the cpu path', RuntimeWarning)\n        return ext.relu_fwd(x)"),
        name="r12_warner", prelude=False)
    attacker = candidate(extra="import warnings\nwarnings.simplefilter('error')\n",
                         name="r12_warner", prelude=False)  # one extension for all three
    rows = [("attacker", attacker), ("warner", warner),
            ("h1", candidate(name="r12_warner", prelude=False))]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(CpuBackend, "persistent_worker", True)
        got = verify_batch([VerifyRequest(n, "relu", relu_task(64, 64), c, "cpu")
                            for n, c in rows],
                           VerifyOptions(backend="cpu", gpus=1, workers=1, trials=3,
                                         perf_trials=10, perf_budget_s=1.0,
                                         build_cache_dir=str(base / "builds"),
                                         baseline_cache_dir=str(base / "baselines")))
    return {v.candidate_id: v for v in got}


@CPU_BATCH
def test_an_honest_sibling_after_a_warnings_error_filter_is_still_correct(
        warned: dict[str, Any]) -> None:
    """Caught at the verdict (by `outcome.confirmed`): the sibling that warns failed in the
    attacker's worker ("the worker reported runtime_error (candidate.py line 30:
    RuntimeWarning: ...)"), a failure of the worker's word, so it was made again in a fresh
    worker, where it is correct; the honest job after it is correct too (measured)."""
    for name in ("warner", "h1"):
        assert warned[name].status.startswith("correct"), warned[name]
    rules = {f["rule"] for f in warned["warner"].findings}
    assert "confirmed_fresh" in rules or not rules, warned["warner"].findings


@CPU_BATCH
def test_a_warnings_error_filter_is_charged_to_the_job_that_left_it(
        warned: dict[str, Any]) -> None:
    """Before (main at 96c4477, measured here): the attacker correct_slow with no finding, the
    warner's verdict with `confirmed_fresh` (its first run failed in the attacker's worker).
    Now `warnings.filters` is compared by value (`tamper.interpreter_private`): the attacker's
    worker is replaced, with the finding on the attacker, and the warner runs once."""
    attacker = warned["attacker"]
    assert attacker.status.startswith("correct"), attacker
    said = " ".join(f["message"] for f in attacker.findings if f["rule"] == "worker_replaced")
    assert "warnings.filters" in said, attacker.findings
    rules = {f["rule"] for f in warned["warner"].findings}
    assert "confirmed_fresh" not in rules, warned["warner"].findings



@CPU_BATCH
def test_a_candidate_cannot_slow_a_later_siblings_warnings(tmp_path: Path) -> None:
    """`verify_batch` on the persistent cpu loop, static checks on: an honest ReLU that warns
    in forward, the attacker (SLOW_WARNINGS_EXTRA at module level of a compiled ReLU), the
    same honest ReLU again (its warning's words differ: another source). Before (measured
    here): the first timed at 30 us a call, the attacker correct with no finding, the second
    at 5407 us (reward 0.553 -> 0.500), no finding on any."""
    from redteam_cases import candidate
    from verifier_cases import relu_task

    from verifier.api import verify_batch
    from verifier.backends.cpu import CpuBackend
    from verifier.protocol import VerifyOptions, VerifyRequest

    def warner(tag: str) -> str:
        return candidate(extra="import warnings\n", forward=(
            f"warnings.warn('ks-honest: the cpu path {tag}', RuntimeWarning)\n"
            "        return ext.relu_fwd(x)"), name="r12_warner", prelude=False)

    rows = [("before", warner("a")),
            ("attacker", candidate(extra=SLOW_WARNINGS_EXTRA, name="r12_slowwarn",
                                   prelude=False)),
            ("after", warner("b"))]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(CpuBackend, "persistent_worker", True)
        got = {v.candidate_id: v for v in verify_batch(
            [VerifyRequest(n, "relu", relu_task(64, 64), c, "cpu") for n, c in rows],
            VerifyOptions(backend="cpu", gpus=1, workers=1, trials=3, perf_trials=10,
                          perf_budget_s=1.0, build_cache_dir=str(tmp_path / "builds"),
                          baseline_cache_dir=str(tmp_path / "baselines")))}
    before, after = got["before"], got["after"]
    assert before.status.startswith("correct") and before.runtime_us, before
    assert after.status.startswith("correct") and after.runtime_us, after
    assert after.runtime_us < 4 * before.runtime_us + 1000.0, (before.runtime_us,
                                                               after.runtime_us)
