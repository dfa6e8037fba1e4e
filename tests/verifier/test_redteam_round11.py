"""Red-team round 11 on the cpu backend: attacks on main at 258f195 on what changed lately and
was never attacked, as a policy rewarded for holes would try them (cases in tests/verifier/
redteam_round11_cases.py). Each was measured on main first (the "Before" of each test); an
open one is a strict xfail naming its fix.

- Whose doing a failed build is (`verifier.compile.build_cause`): the whole log was searched
  for words of the environment, the candidate's own diagnostics too, so an `#error No space left
  on device`, a static_assert's message, a `#warning`, or a function named `ks_pch` made the
  candidate's own failure the host's: never cached, built again on every request that sends it,
  and the host blamed. Fixed: a diagnostic at the spec's own lines counts only in the compiler's
  own words (its crash, an include not found), a symbol an import failed on not at all; and a
  static initializer that writes the host's words (or the sandbox's) on the load check's
  stderr: the child writes a byte on the builder's pipe before the object loads
  (`verifier.isolation.started`), and its words after are the spec's
  (`verifier.compile.object_import`).
- A batch that fails alike (`verifier.isolation.sandbox.common_failure`, the pipeline's verify
  stage): three candidates raising the same PermissionError stopped `kernelsynth build` as "the
  environment is broken". Fixed: a failure that names the candidate's own code is its own; and
  an extension that prints the broken interpreter's (or the sandbox's) words and ends its
  process: the worker writes a byte on the parent's pipe before the candidate's module runs,
  and `common_failure` counts only runs that never reached it.
- The cached-result cheat (`verifier.judge.trial_judge`, `decide.CACHED_RESULT`): an honest
  kernel whose wrong output is a constant (a flag left False) repeated a passing trial's output
  and was called a cheat (reward 0.0, not 0.2; a `cheat` label in the datasets). Fixed: only an
  output that varies is evidence of a kept result (`verifier.judge.tensors.varies`).
- CUDA's JIT cache (CUDA_CACHE_PATH): one folder for every job of a persistent worker, which
  any job can write; the driver loads an entry by the hash of the PTX it JITs, so a job could
  place machine code for a sibling's PTX. Fixed: CUDA_CACHE_DISABLE=1 for every sandboxed child
  (`verifier.isolation.sandbox.scrubbed_env`); the wiring is tested here (no GPU).
- The compile-core partition (`compile_cores`): the build stage runs candidate code too (its
  module, to collect computed load_inline calls; its object's static initializers, in the load
  check), and it ran on every cpu, the timing lanes' too, and was not counted as load for the
  cpu baselines. Fixed: both on the compilers' cpus and counted (`backends.candidate_tool`).
  Its override `KS_TIMING_CORES` is reached by no candidate or request (the parent's
  environment; requests carry sources and a timeout); a value that is no number ended
  verify_batch with int()'s words. Fixed: an error naming the variable.
- The fresh-worker confirmation (`verifier.run.outcome`): a failure the judge established is
  voided by the candidate's own word (a line out of turn, a forged "did not settle" finding) in
  a worker that ran earlier jobs; with the windows' early end telling a cheat it was caught,
  a re-roll. Fixed: the judge's failure stands (unit level here; end to end on the cpu
  persistent loop in tests/verifier/test_reroll.py), and the clock serves the planned windows
  after a failed one.
GPU forms: the CUDA JIT cache and the partition are GPU-host matters tested here by their
wiring (no GPU here); on an H100 host, `KS_REDTEAM_WORKER_BACKEND=cuda pytest -k persistent_worker
tests/verifier/test_redteam_round11.py` runs the JIT-cache job in a CUDA worker.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from redteam_round11_cases import (  # noqa: E402
    BROKEN_WORDS,
    CPUS_MODULE,
    CPUS_STATIC,
    DIE_CPP,
    FLAG_TASK,
    FORGED_DESCRIPTION,
    FORGED_FAILURE,
    FORGED_IMPORT,
    FORGED_SLOW,
    HOST_FAILURE_LOGS,
    OWN_FAILURE_LOGS,
    OWN_FAILURES,
    RAISE_FORWARD,
    SANDBOX_CPP,
)

from verifier.compile.build_cause import OBJECT_SAID, environment_cause  # noqa: E402
from verifier.isolation.sandbox import common_failure, scrubbed_env  # noqa: E402
from verifier.isolation.started import REACHED  # noqa: E402
from verifier.judge import decide  # noqa: E402
from verifier.judge.tensors import varies  # noqa: E402

pytestmark = pytest.mark.heavy  # out of the default run: CI runs it (-m heavy)


# --- whose doing a failed build is --------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(OWN_FAILURE_LOGS))
def test_a_candidates_own_build_failure_is_not_the_hosts(name: str) -> None:
    """Before (main at 258f195, each built on the cpu backend here): `environment_cause` named
    the candidate's own line ("cpp_sources[0]:2:2: error: #error No space left on device", the
    static_assert's message, the `#warning`, the undefined `..6ks_pchEi`), so the failure was
    not cached ("[build cache] ... not cached: ...") and each request built it again. Now the
    spec's own diagnostics count only in the compiler's own words: the failure is its own."""
    assert environment_cause(OWN_FAILURE_LOGS[name]) == "", OWN_FAILURE_LOGS[name]


@pytest.mark.parametrize("name", sorted(HOST_FAILURE_LOGS))
def test_what_the_host_does_to_a_build_is_still_the_hosts(name: str) -> None:
    """The other side of the fix: a trimmed precompiled header, a compiler the OOM killer
    ended, a header not (yet) installed, a compiler that crashed, a timeout stay environmental
    (never cached), the first two as tests/verifier/test_build_cause.py makes them for real."""
    assert environment_cause(HOST_FAILURE_LOGS[name]), HOST_FAILURE_LOGS[name]


def test_an_error_directive_naming_the_host_is_cached_as_the_candidates(tmp_path: Path) -> None:
    """End to end, one real compile: the `#error No space left on device` candidate. Before:
    not cached ("[build cache] 6e464d1e9f8d600f not cached: cpp_sources[0]:2:2: error: #error No
    space left on device"), so its second build compiled again. Now its second build is the
    cached failure; an honest spec in the same cache still builds and imports (independent
    check: the attack left nothing for the next candidate)."""
    from verifier.backends import get_backend
    from verifier.checks.extspec import ExtensionSpec
    from verifier.compile.builder import BuildContext, Builder

    spec = ExtensionSpec("e", [OWN_FAILURES["error_directive"]], functions=["twice"])
    honest = ExtensionSpec("e", ["int twice(int x) { return 2 * x; }"], functions=["twice"])

    def builder() -> Builder:
        return Builder(BuildContext(get_backend("cpu"), tmp_path, check_import=False))

    first = builder().build([spec])[spec.key]
    assert not first.ok and "#error No space left on device" in first.log, first.log[-2000:]
    assert first.environmental == "", first.environmental
    again = builder().build([spec])[spec.key]
    assert not again.ok and again.cached and again.log == first.log
    ok = builder().build([honest])[honest.key]
    assert ok.ok and not ok.cached, ok.log[-2000:]
    assert "No space left" not in ok.log


@pytest.mark.parametrize("name", ["no_space", "sandbox_words", "slow_words"])
def test_a_static_initializer_that_prints_the_hosts_words_is_the_candidates(
        tmp_path: Path, name: str) -> None:
    """Before (measured on main, built for real: FORGED_IMPORT): "import of the built extension
    failed: OSError: [Errno 28] No space left on device", not cached (any words of its own:
    'cpus=2' was 'no error at the spec's own lines'). Now the load check's child writes a byte
    on the builder's pipe just before the object loads (`verifier.isolation.started`), and what
    it wrote after is the object's (`verifier.compile.object_import`): the failure is cached as
    the spec's own, its second build the cached failure. Variants: an initializer that prints
    the sandbox's own description of a child the host killed ("worker died with SIGKILL ...";
    the sandbox_words), and the load check's words of a slow import (its import took 14 s, in
    a run that took far less by the verifier's clock)."""
    from verifier.backends import get_backend
    from verifier.checks.extspec import ExtensionSpec
    from verifier.compile.builder import BuildContext, Builder

    source, said = {"no_space": (FORGED_IMPORT, "OSError: [Errno 28] No space left on device"),
                    "sandbox_words": (FORGED_DESCRIPTION, "worker died with SIGKILL (killed "
                                      "(memory or CPU limit))"),
                    "slow_words": (FORGED_SLOW, "its import took 14 s")}[name]
    spec = ExtensionSpec("e", [source], functions=["twice"])

    def built() -> Any:
        return Builder(BuildContext(get_backend("cpu"), tmp_path, check_import=True)).build(
            [spec])[spec.key]

    first = built()
    assert not first.ok and first.log.endswith(said), first.log[-2000:]
    assert OBJECT_SAID in first.log and first.environmental == "", first.log[-2000:]
    again = built()
    assert not again.ok and again.cached and again.log == first.log


def test_the_words_of_a_load_check_that_never_loaded_the_object_stay_the_hosts() -> None:
    """The other side (`object_import.import_failure`, given the sandbox's results as the
    launchers return them): a child that never reached the object (torch not importable, a
    sandbox that cannot start) speaks for the environment, as the sandbox does of a child the
    host killed (SIGKILL: the OOM killer) or timed out, and the verifier's own clock of an
    import that took long; a crash of the object's own (SIGSEGV) is the spec's."""
    from verifier.compile.object_import import import_failure
    from verifier.isolation.sandbox import SandboxResult

    def cause(started: bool, stderr: str = "", signal: str | None = None, wall_s: float = 1.0,
              timed_out: bool = False) -> str:
        res = SandboxResult(1 if signal is None else -9, timed_out, wall_s, "", stderr,
                            signal_name=signal, started=started)
        return environment_cause(import_failure(res))

    space = "OSError: [Errno 28] No space left on device\n"
    assert cause(False, space) and cause(False, "ModuleNotFoundError: No module named 'torch'")
    assert cause(True, space) == ""
    assert cause(True, signal="SIGKILL") and cause(True, timed_out=True, wall_s=120.0)
    assert cause(True, signal="SIGSEGV") == ""
    slow = "static initializers misbehave: its import took 14 s\n"
    assert cause(True, slow, wall_s=15.0) and cause(True, slow, wall_s=2.0) == ""


# --- a batch that fails alike -----------------------------------------------------------------
@pytest.fixture(scope="module")
def alike(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One batch: three candidates that raise a PermissionError in forward, three whose
    extension prints a hidden interpreter's FileNotFoundError and exits, three whose extension
    prints the sandbox's own words and exits, an honest one last."""
    from redteam_cases import candidate
    from verifier_cases import relu_task

    from verifier.api import verify_batch
    from verifier.protocol import VerifyOptions, VerifyRequest

    base = tmp_path_factory.mktemp("alike")
    rows = [(f"raise{i}", candidate(forward=RAISE_FORWARD.format(i=i), name="r11_alike",
                                    prelude=False)) for i in range(3)]
    rows += [(f"die{i}", candidate(forward=f"return ext.relu_fwd(x)  # {i}", cpp=DIE_CPP,
                                   name="r11_die", prelude=False)) for i in range(3)]
    rows += [(f"sbx{i}", candidate(forward=f"return ext.relu_fwd(x)  # {i}", cpp=SANDBOX_CPP,
                                   name="r11_sbx", prelude=False)) for i in range(3)]
    rows += [("honest", candidate(name="r11_alike", prelude=False))]
    reqs = [VerifyRequest(n, "relu", relu_task(4, 8), c, "cpu") for n, c in rows]
    got = verify_batch(reqs, VerifyOptions(backend="cpu", workers=1,
                                           build_cache_dir=str(base / "builds"),
                                           baseline_cache_dir=str(base / "baselines")))
    return {v.candidate_id: v for v in got}


def _reasons(verdicts: list[Any]) -> list[str]:
    """What the pipeline's verify stage hands `common_failure` (pipeline/stages/verify.py)."""
    return [v.error if v.status == "runtime_error" else "" for v in verdicts]


def test_candidates_that_raise_the_sandboxs_errors_do_not_stop_the_run(
        alike: dict[str, Any]) -> None:
    """Three candidates whose forward raises `PermissionError(13, "Permission denied", ...)`.
    Before (measured here on main): each verdict "candidate.py line 29: PermissionError: [Errno
    13] Permission denied: '/opt/weights.bin'" (the same line in each), and `common_failure`
    returned it: the pipeline's verify stage raised EnvironmentFailure ("every one of 3
    candidates (cpu) failed the same way, so the environment is broken") and `kernelsynth
    build` stopped. Now a failure that names the candidate's code is the candidate's. The
    independent check: the pipeline's own stage keeps their verdicts."""
    raised = [alike[f"raise{i}"] for i in range(3)]
    for v in raised:
        assert v.status == "runtime_error" and "candidate.py line" in v.error, v
        assert "PermissionError" in v.error
    assert common_failure(_reasons(raised)) is None
    assert alike["honest"].status.startswith("correct"), alike["honest"]
    _stage_keeps(raised)


def _stage_keeps(verdicts: list[Any]) -> None:
    """The pipeline's verify stage given these verdicts keeps them (raises nothing). Skipped
    where the pipeline does not import (a GPU host holding torch and the verifier alone)."""
    pytest.importorskip("pydantic", reason="the pipeline needs pydantic; this host has the "
                        "verifier alone (the verdicts above were checked)")
    import pipeline.stages.verify as verify_mod
    from pipeline.config import VerifyConfig
    from schemas import Candidate, Task

    tasks = {f"t{i}": Task(task_id=f"t{i}", name=f"t{i}", source="x", cpu_source="x")
             for i in range(len(verdicts))}
    cands = [Candidate(f"c{i}", f"t{i}", "cpu", "test", f"code {i}")
             for i in range(len(verdicts))]

    def replay(reqs: list[Any], opts: Any, progress: Any = None) -> list[Any]:
        from dataclasses import replace
        return [replace(v, candidate_id=r.candidate_id, task_id=r.task_id)
                for r, v in zip(reqs, verdicts, strict=True)]

    saved = verify_mod.verify_batch
    verify_mod.verify_batch = replay
    try:
        kept, _ = verify_mod.verify_with_rejections(tasks, cands, VerifyConfig(backend="cpu"),
                                                    Path("/nonexistent-cache"))
    finally:
        verify_mod.verify_batch = saved
    assert [v.status for v in kept] == [v.status for v in verdicts]


def test_an_install_without_what_candidates_import_still_stops_the_run() -> None:
    """The other side of the fix: candidates whose `import numpy` fails in their own code
    because the sandbox hides the install are still the environment's; one candidate's own
    PermissionError among broken-sandbox failures makes the batch no common failure."""
    hidden = "candidate.py line 3: ModuleNotFoundError: No module named 'numpy'"
    assert common_failure([hidden] * 3) == hidden
    broken = "worker exited with code 1: FileNotFoundError: [Errno 2] /tmp/venv/bin/python"
    assert common_failure([broken] * 3) == broken
    own = "candidate.py line 9: PermissionError: [Errno 13] Permission denied: '/opt/w.bin'"
    assert common_failure([own] * 3) is None and common_failure([broken, broken, own]) is None


def test_an_extension_that_dies_with_the_interpreters_words_does_not_stop_the_run(
        alike: dict[str, Any]) -> None:
    """Before (measured here on main): each "worker exited with code 1: FileNotFoundError:
    [Errno 2] No such file or directory: '/tmp/venv/bin/python'", word for word the error of
    tests/pipeline/candidates/test_verify_environment.py's broken interpreter. Now the worker
    writes a byte on a pipe of the parent's just before the candidate's module runs
    (`verifier.isolation.started`), the parent says a run that wrote it ended "after the
    candidate's code started", and `common_failure` counts only runs that never did; the
    pipeline's own stage keeps their verdicts."""
    died = [alike[f"die{i}"] for i in range(3)]
    for v in died:
        assert v.status == "runtime_error" and "/tmp/venv/bin/python" in v.error, v
        assert REACHED in v.error, v.error
    assert common_failure(_reasons(died)) is None
    _stage_keeps(died)


def test_in_the_persistent_worker_too_an_extension_that_dies_with_the_interpreters_words_is_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU's worker loop (`CpuBackend.persistent_worker`, run here on the cpu): its job's
    start line is the byte's counterpart. Before (cause17's merge, measured here): "worker
    exited with code 1: FileNotFoundError: [Errno 2] No such file or directory:
    '/tmp/venv/bin/python'" with no word of where it came from, and `common_failure` returned
    it; now a worker that ended after its job's start says so (`GpuWorkerProcess.describe_exit`),
    and an honest job after them is correct."""
    from redteam_cases import candidate
    from verifier_cases import relu_task

    from verifier.api import verify_batch
    from verifier.backends.cpu import CpuBackend
    from verifier.protocol import VerifyOptions, VerifyRequest

    monkeypatch.setattr(CpuBackend, "persistent_worker", True)
    rows = [(f"die{i}", candidate(forward=f"return ext.relu_fwd(x)  # {i}", cpp=DIE_CPP,
                                  name="r11_die", prelude=False)) for i in range(3)]
    rows += [("honest", candidate(name="r11_alike", prelude=False))]
    reqs = [VerifyRequest(n, "relu", relu_task(4, 8), c, "cpu") for n, c in rows]
    got = {v.candidate_id: v for v in verify_batch(reqs, VerifyOptions(
        backend="cpu", gpus=1, workers=1, build_cache_dir=str(tmp_path / "builds"),
        baseline_cache_dir=str(tmp_path / "baselines")))}
    died = [got[f"die{i}"] for i in range(3)]
    for v in died:
        assert v.status == "runtime_error" and "/tmp/venv/bin/python" in v.error, v
        assert REACHED in v.error, v.error
    assert common_failure(_reasons(died)) is None
    assert got["honest"].status.startswith("correct"), got["honest"]


def test_an_extension_that_dies_with_the_sandboxs_words_does_not_stop_the_run(
        alike: dict[str, Any]) -> None:
    """A variant: the extension prints the sandbox's own "[sandbox] could not drop root" words
    (`verifier.isolation.isolate`) and exits. Before (measured here on main): each "worker
    exited with code 1: PermissionError: [sandbox] could not drop root to uid 1000123: [Errno 1]
    Operation not permitted", and `common_failure` returned it. Now it reached the candidate's
    code: no broken sandbox. (Its other variants, an extension that SIGKILLs its process and a
    candidate that writes the harness's result file with a broken worker's words, are refused
    by the static checks here (`kill(`, `torch.os`: measured on main); past them, each is
    tested where the parent reads it: tests/verifier/test_sandbox.py and below.)"""
    got = [alike[f"sbx{i}"] for i in range(3)]
    for v in got:
        assert v.status == "runtime_error" and "[sandbox]" in v.error, v
        assert REACHED in v.error, v.error
    assert common_failure(_reasons(got)) is None, _reasons(got)
    _stage_keeps(got)


def test_a_result_file_with_a_broken_workers_words_is_the_candidates(tmp_path: Path) -> None:
    """A candidate past the static checks writes the harness's result file (the nonce found on
    the stack, `redteam_cases.FRAME_NONCE`) with the words of a worker that never started
    (BROKEN_WORDS) as its runtime error, as `SandboxRunner.run` runs it. Before (main, by
    reading): its error was the verdict's word for word, and `common_failure` of three stopped
    the run. Now the run wrote its byte on the parent's pipe, so its result is the candidate's
    word: the error gets the parent's REACHED and no number of them is a broken environment."""
    from types import SimpleNamespace

    from redteam_cases import FRAME_NONCE
    from verifier_cases import relu_task

    from verifier.backends.cpu import CpuBackend
    from verifier.isolation.sandbox import SpawnLauncher
    from verifier.protocol import VerifyOptions
    from verifier.run.runners import SandboxRunner

    code = ("import os as P, sys as S\n" + FRAME_NONCE + FORGED_FAILURE
            + "\nforge()\n")
    opts = VerifyOptions(backend="cpu", run_timeout_s=120.0, trials=2,
                         baseline_cache_dir=str(tmp_path / "bl"))
    runner = SandboxRunner(SpawnLauncher(), CpuBackend(), opts, {}, threads=1)
    item = SimpleNamespace(built={}, code=code,
                           req=SimpleNamespace(task_source=relu_task(4, 8), task_id="relu"))
    job = {"nonce": "r11-forge", "backend": "cpu", "input_seed": 1,
           "options": {"trials": 2, "seed": 0, "construct": "device"}}
    out = runner.run(item, job)
    assert out.payload is not None and out.payload["nonce"] == "r11-forge", out.failure
    error = out.payload["error"]
    assert error.startswith(BROKEN_WORDS) and error.endswith(f"({REACHED})"), error
    assert common_failure([error] * 3) is None and common_failure([BROKEN_WORDS] * 3)


# --- the cached-result cheat ------------------------------------------------------------------
def _flag_judge(input_seed: int) -> Any:
    from verifier.judge.trial_judge import TrialJudge

    return TrialJudge({"task_source": FLAG_TASK, "seed": 0, "input_seed": input_seed,
                       "trials": 3, "tol": (1e-4, 1e-4, 1e-2, 1e-2), "variants": []},
                      1 << 30, 16 << 20)


def _judged(input_seed: int, model: Any) -> tuple[bool, str, list[Any]]:
    """FLAG_TASK's trials judged with `model` as the worker's forward: (ok, why, the
    reference's outputs of each trial)."""
    from verifier.judge.trial_io import ArenaTrials

    judge = _flag_judge(input_seed)
    io = ArenaTrials(judge.spec, os.dup(judge.arena.fd), "cpu")
    refs = []
    try:
        for t in range(len(judge.spec["blocks"][0])):
            x = io.inputs(0, t)
            refs.append((x[0] > 1.5).any(dim=1))
            io.keep(0, t, model(*x))
        ok, why, _ = judge.check(io.report()["trial_report"], None)
    finally:
        io.close()
        judge.close()
    return ok, why, refs


def test_a_wrong_kernel_with_a_constant_output_is_incorrect_not_a_cheat() -> None:
    """A per-row flag (FLAG_TASK) whose kernel never sets it (all False: a wrong threshold, a
    reduction that drops its rows), on input seeds where the first trial's right answer is all
    False and the second's is not. Before (main): "the output did not change with new inputs
    (cached result): trial 2's output is an earlier trial's, bit for bit" and the parent's
    `cheat` (reward 0.0, a cheat in the datasets). Now `incorrect` (reward 0.2, as any wrong
    kernel); a kept result that varies is still the cheat (independent check, the same judge)."""
    def never(x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(x.shape[0], dtype=torch.bool)

    seed = next(s for s in range(4000, 4400)
                if (lambda refs: not refs[0].any() and refs[1].any())(_judged(s, never)[2]))
    ok, why, _ = _judged(seed, never)
    assert not ok and decide.CACHED_RESULT not in why and "trial 2" in why, why
    kept: list[torch.Tensor] = []

    def cache(x: torch.Tensor) -> torch.Tensor:
        if not kept:  # the first trial's right answer, kept (it varies)
            kept.append(torch.tensor([True, False]))
        return kept[0]

    varying = next(s for s in range(4000, 4400)
                   if (lambda refs: torch.equal(refs[0], torch.tensor([True, False]))
                       and not torch.equal(refs[1], refs[0]))(_judged(s, never)[2]))
    ok, why, _ = _judged(varying, cache)
    assert not ok and why.startswith(decide.CACHED_RESULT), why


def test_only_an_output_that_varies_is_evidence_of_a_kept_result() -> None:
    """`varies` (the rule of the judge's and the worker's comparisons): a tensor of two values
    anywhere in the outputs; a constant, a one-element output or plain values are not."""
    assert not varies(torch.zeros(5, dtype=torch.bool)) and not varies(torch.full((3, 3), 2.0))
    assert not varies(torch.tensor([7.0])) and not varies((3, None, torch.ones(4)))
    assert varies(torch.tensor([1.0, 2.0])) and varies((torch.ones(2), torch.arange(3)))
    assert varies(torch.tensor([float("nan"), float("nan")]))  # NaN != NaN: not a constant


# --- the fresh-worker confirmation -------------------------------------------------------------
def _judged_wrong(nonce: str) -> Any:
    """A run of a persistent worker as `GpuRunner._judged_here` leaves it when the judge found
    its trials wrong: the worker said ok, the judge compared and answers not ok."""
    from verifier.run.outcome import RunOutcome

    out = RunOutcome({"nonce": nonce, "outcome": "ok", "findings": []}, rechecked=True,
                     judge_compared=True)
    out.referee = lambda op, args: (False, "trial 1, checked by the verifier itself: output 0: "
                                    "differs beyond atol")
    return out


@pytest.mark.parametrize("word", ["line", "finding"])
def test_a_judged_failure_is_not_voided_by_the_candidates_word(word: str) -> None:
    """Before (main at 258f195): the judged-wrong run, with a {"settled": true} line written
    during the job (`tampered`, after 2 earlier jobs) or a "worker_replaced ... did not settle"
    finding the candidate added to its result, was made again in a fresh worker, whose passing
    run stood. Now a failure the judge established stands (`outcome.judged_failure`; only the
    parent's own evidence of an earlier job's residue would void it), and the settle's failure is
    the parent's record (`RunOutcome.unsettled`), not a finding searched in the payload."""
    from verifier.run.outcome import RunOutcome, confirmed, reported_failure, tampered

    runs = iter([_judged_wrong("n1"), RunOutcome({"nonce": "n1", "outcome": "ok",
                                                  "findings": []})])

    def run() -> Any:
        out = next(runs)
        if out.referee is None:  # the fresh worker's run: the candidate behaves there
            return out
        if word == "line":
            return tampered(out, "a line of the worker's loop out of turn (settled)", 2, "n1")
        out.payload["findings"].append({"rule": "worker_replaced", "severity": "warning",
                                        "line": None, "message": "the worker did not settle "
                                        "after the run (forged): it was replaced"})
        out.suspect = reported_failure(out, "n1")
        return out

    got = confirmed(run, lambda: None)
    assert got.referee is not None and not got.referee("run", {})[0], (got.payload,
                                                                       got.confirmed)


# --- CUDA's JIT cache -------------------------------------------------------------------------
ASK_CUDA_CACHE = ("import os; raise RuntimeError('disable=' + str(os.environ.get("
                  "'CUDA_CACHE_DISABLE')) + ' path=' + str(os.environ.get('CUDA_CACHE_PATH')))")


def test_cudas_jit_cache_is_off_in_every_job_of_a_persistent_worker() -> None:
    """Before (main, measured here in the persistent worker's cpu loop): two jobs of one worker
    saw "disable=None path=/tmp/w/.nv": one JIT cache for every job, writable by each (the
    driver reads CUDA_CACHE_PATH once, at its start, so a per-job folder cannot be had). A job
    that JITs PTX (code=compute_XX only, or a PTX string loaded by the driver) would load the
    machine code an earlier job placed under its PTX's hash. Now every job sees
    CUDA_CACHE_DISABLE=1 (the verifier's builds carry the GPU's own code: nothing is JITed)."""
    from redteam_round7_cases import NUMPY_RELU
    from test_redteam_round9 import _jobs

    ask = NUMPY_RELU.replace("        import numpy as np\n", f"        {ASK_CUDA_CACHE}\n")
    got = _jobs([ask, ask])
    for payload in got:
        assert payload["outcome"] == "runtime_error", payload
        assert "disable=1 " in payload["error"], payload["error"]
    assert got[0]["worker_pid"] == got[1]["worker_pid"]  # one worker: the driver's one start


def test_no_caller_turns_cudas_jit_cache_back_on() -> None:
    """The sandbox's environment sets it last: a caller's extra variables (a worker's private
    caches with CUDA_CACHE_PATH, an operator's CUDA_CACHE_DISABLE=0) do not undo it."""
    env = scrubbed_env({"CUDA_CACHE_PATH": "/tmp/w/.nv", "CUDA_CACHE_DISABLE": "0"})
    assert env["CUDA_CACHE_DISABLE"] == "1" and env["CUDA_CACHE_PATH"] == "/tmp/w/.nv"


def test_a_sandboxed_run_sees_cudas_jit_cache_off(tmp_path: Path) -> None:
    """The sandboxed children (the cpu runner's, the non-persistent CUDA worker's) as they
    run: their environment says the cache is off."""
    from verifier.isolation.sandbox import SandboxLimits, run_sandboxed

    res = run_sandboxed([sys.executable, "-c", "import os, json; open('result.json', 'w')"
                         ".write(json.dumps({'v': os.environ.get('CUDA_CACHE_DISABLE')}))"],
                        limits=SandboxLimits(timeout_s=60), workdir=tmp_path / "run")
    assert res.payload == {"v": "1"}, res.describe_failure()


# --- the compile-core partition ----------------------------------------------------------------
def test_the_build_stages_candidate_code_runs_on_the_compilers_cpus_and_counts_as_load(
        tmp_path: Path) -> None:
    """A GPU batch keeps its timing lanes' cores free of compilers (`compile_cpus(compile_cores(
    lanes))`, taskset on every compiler). The build stage runs candidate code too: its module,
    to collect computed load_inline calls (up to 60 s), and its object's static initializers in
    the load check (up to 120 s, threads of its own). Before (main, here inside
    `compile_cpus([first cpu])` on 2 cpus): the collected module ran on "cpus_0_1" and the
    static initializers on "cpus=2", every core, the lanes' too (a module that spins 60 s slows
    every sibling's launch-bound timing: 24-29 us -> 47 us with compilers on an H100 node's
    cores, cpu_bound.py); neither counted as a tool in `TOOL_LOAD`, so a cpu baseline timed
    beside it was cached as quiet. Now both run on the compilers' cpus (pinned, seccomp) and
    count as a compiler: a cpu baseline timed beside them is re-timed, not cached."""
    from verifier.backends import compile_cpus, get_backend
    from verifier.backends.tool_load import TOOL_LOAD
    from verifier.checks.extspec import ExtensionSpec
    from verifier.compile.builder import BuildContext, Builder
    from verifier.isolation.sandbox import SpawnLauncher
    from verifier.protocol import VerdictData, VerifyOptions, VerifyRequest
    from verifier.stages import Item, collect_specs

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("one cpu: no partition to leave")
    req = VerifyRequest("c", "t", FLAG_TASK, CPUS_MODULE, "cpu")
    item = Item(req, VerdictData("c", "t", "runtime_error", "extract", "cpu"), code=CPUS_MODULE)
    spec = ExtensionSpec("e", [CPUS_STATIC], functions=["twice"])
    with compile_cpus(cpus[:1]):
        mark = TOOL_LOAD.mark()
        collect_specs(item, VerifyOptions(backend="cpu"), SpawnLauncher())
        counted = TOOL_LOAD.ran_since(mark)
        built = Builder(BuildContext(get_backend("cpu"), tmp_path, check_import=True)).build(
            [spec])[spec.key]
    assert not item.done and [s.name for s in item.specs] == [f"cpus_{cpus[0]}"], item.specs
    assert counted
    assert not built.ok and built.log.endswith("cpus=1"), built.log[-2000:]


# --- the compile-core partition's override ----------------------------------------------------
def test_a_malformed_timing_cores_override_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """`KS_TIMING_CORES` is read in the verifying process only (no request field reaches it; a
    candidate's process has its own environment). Before: "four" ended verify_batch of a GPU
    batch with "invalid literal for int() with base 10: 'four'". Now the error names it."""
    from verifier.isolation.cpu_bound import compile_cores

    monkeypatch.setenv("KS_TIMING_CORES", "four")
    with pytest.raises(ValueError, match="KS_TIMING_CORES='four'"):
        compile_cores(1, list(range(16)))
    monkeypatch.setenv("KS_TIMING_CORES", "3")
    assert compile_cores(1, list(range(16))) == list(range(3, 16))
