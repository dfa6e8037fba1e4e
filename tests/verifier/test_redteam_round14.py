"""Red-team round 14 on the cpu backend: attacks on branch attack14 (from main at 264aee6, with
main's early trial check, e6e0878, merged), as a policy rewarded for holes would try them (cases
in tests/verifier/redteam_round14_cases.py). Each was measured first (the "Before" of each
test); an open one is a strict xfail naming its fix.

Closed here: residue of the persistent worker the residue check did not compare
(`verifier.run.thread_settings`: scheduling policy and cpu affinity, timer slack, the dumpable
flag, the dispatcher's thread-local key sets (autocast, an excluded key), inference and anomaly
modes, torch's config modules, numpy's buffer size, the signal wake-up descriptor, coroutine
hooks, C-level signal handlers and POSIX timers, the descriptor table, the C environment) and
a C method's function pointer swapped under its unchanged descriptor (`tamper.identity`) or a
numpy ufunc's inner loop (`hidden_state.numpy_loops`); a
JSON line or file nested past the parser's depth (the worker's result socket, a sandbox's
result.json, the trial report at "t": a RecursionError was a verifier error); the variants a
verdict records as checked (the end's list, where the judge had checked the one sent at "t").
Held: the caches
a later verdict reads (the worker writes none), a run told at "t" that its trials failed that
forges the worker's HOST_ONLY for a second draw (`incorrect` stands). Closed in session 24: a run
that voids its slow windows by dying after earlier jobs got a second timing draw.
Not tried here: a GPU's device arena (fingerprints), cgroup-v2 metering (this host is v1).
GPU form: with `KS_REDTEAM_WORKER_BACKEND=cuda` on a GPU host every job loop below runs in a
CUDA worker (`verifier_cases.cpu_loop_jobs`: `GpuRunner(opts, {}, "cuda")`, the judge in its
referee), the numpy candidates in their cuda form (`redteam_round7_cases.on_worker_device`).
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the cases (as conftest does; --noconftest)
from verifier_cases import skip_without_worker_device  # noqa: E402

skip_without_worker_device()
from redteam_round14_cases import (  # noqa: E402
    COPY_IS_ADD,
    DEEP_LINE,
    DUP2_CLOCK,
    MAXIMUM_IS_MINIMUM,
    NUMPY_RELU,
    POSIX_TIMER,
    ROUTES,
    VOIDS_SLOW,
    WAVE_RELU,
    canary,
    leaving,
    reroll,
    state,
    writer,
)

pytestmark = pytest.mark.heavy  # out of the default run: CI runs it (-m heavy)


def _said(out: Any) -> str:
    return " ".join(f.get("message", "") for f in (out.payload or {}).get("findings", ()))


def _ok(out: Any) -> bool:
    return out.referee is not None and bool(out.referee("run", {})[0])


def _why(out: Any) -> Any:  # the judge's answer on the trials, or the worker's payload
    return out.referee("run", {}) if out.referee else out.payload


def _pid(out: Any) -> Any:  # the worker that ran the job
    return (out.payload or {}).get("worker_pid")


# --- 1-6. residue a later job runs under: scheduling, dispatch keys, numpy, timer slack ---------
def test_process_settings_a_job_leaves_reach_no_later_job() -> None:
    """On the real path (`GpuRunner`, cpu loop): the canary (an honest numpy ReLU, off by one
    where its process is not as this test's own: `state()`), then for each route
    the attacker (an honest ReLU leaving ROUTES[route] in its `__del__`) and the canary again.
    Before (main at 264aee6, measured here, a loop of canary, attacker, canary per route): for
    every route the attacker correct with no finding and the later canary failed by the judge's
    own check ("trial 1, checked by the verifier itself: output 0: 65536 of 65536 elements
    differ ...: got 1, expected 0"), nothing run again: the failure stands on the honest job.
    (`python_key` once ran the attacker again instead: its blinded trace made its trials
    slower than its windows.) Now each is compared (`verifier.run.thread_settings`): each
    attacker's worker is replaced with the finding on it, every canary correct."""
    from verifier_cases import cpu_loop_jobs

    routes, fresh = sorted(ROUTES), state()
    sources = [canary(fresh)]
    for route in routes:
        sources += [leaving(NUMPY_RELU, ROUTES[route]), canary(fresh)]
    outs, _ = cpu_loop_jobs(sources, "r14set")
    for route, attacker, later in zip(routes, outs[1::2], outs[2::2], strict=True):
        assert _ok(attacker), (route, attacker.referee("run", {}) if attacker.referee else None)
        assert "its worker was replaced" in _said(attacker), (route, _said(attacker))
        assert _ok(later), (route, later.referee("run", {}) if later.referee else later)
    assert _ok(outs[0])


@pytest.mark.parametrize("route", ["wakeup_fd", "dumpable", "inductor_config", "asyncgen",
                                   "inference_mode", "anomaly", "putenv"])
def test_more_settings_a_job_leaves_are_residue(route: str) -> None:
    """Each route planted in this process is seen by the residue check, and nothing once it is
    undone. Before (main at 264aee6, measured here): `left_in_process` empty for each
    (`signal.set_wakeup_fd` of a dup'ed pipe end, `prctl(PR_SET_DUMPABLE, 0)`,
    `torch._inductor.config.fallback_random = True`, `sys.set_asyncgen_hooks`, an
    `inference_mode` entered and not left, `set_detect_anomaly(True)`, `os.putenv` of
    OMP_NUM_THREADS: C's `getenv` answers it, `os.environ` does not show it)."""
    import ctypes
    import signal
    import sys

    import torch

    from verifier.run.tamper import left_in_process, process_state

    libc = ctypes.CDLL(None)
    r, w = os.pipe()
    os.set_blocking(w, False)
    import torch._inductor.config as inductor

    before = process_state()
    mode = torch.inference_mode()
    undo: Any = None
    if route == "wakeup_fd":
        signal.set_wakeup_fd(w)
        undo = lambda: signal.set_wakeup_fd(-1)  # noqa: E731
    elif route == "dumpable":
        libc.prctl(4, 0, 0, 0, 0)
        undo = lambda: libc.prctl(4, 1, 0, 0, 0)  # noqa: E731
    elif route == "inductor_config":
        inductor.fallback_random = not inductor.fallback_random
        undo = lambda: delattr(inductor, "fallback_random")  # noqa: E731 (back to default)
    elif route == "asyncgen":
        sys.set_asyncgen_hooks(firstiter=lambda gen: None)
        undo = lambda: sys.set_asyncgen_hooks(firstiter=None)  # noqa: E731
    elif route == "putenv":
        was = os.environ.get("OMP_NUM_THREADS")
        os.putenv("OMP_NUM_THREADS", "1" if was != "1" else "2")  # C's getenv only
        undo = lambda: (os.putenv("OMP_NUM_THREADS", was) if was is not None  # noqa: E731
                        else os.unsetenv("OMP_NUM_THREADS"))
    elif route == "inference_mode":
        mode.__enter__()
        undo = lambda: mode.__exit__(None, None, None)  # noqa: E731
    else:
        torch.autograd.set_detect_anomaly(True)
        undo = lambda: torch.autograd.set_detect_anomaly(False)  # noqa: E731
    try:
        left = left_in_process(before)
        undo()
        after = left_in_process(before)
    finally:
        os.close(r)
        os.close(w)
    # (this test's own process shares its descriptor table with every earlier test's threads:
    # a full suite opens and closes files beside it; the worker's table is tested by dup2 below)
    left, after = ([x for x in found if x != "file descriptors"] for found in (left, after))
    assert left, route
    assert not after, after


# --- 7. a line nested past the parser's depth: the parent's reader, the sandbox, the service ---
def test_a_deeply_nested_line_is_a_line_out_of_protocol_not_a_verifier_error() -> None:
    """On the real path (`GpuRunner`, cpu loop): the attacker (round 13's `torch.relu`
    fallback, a cheat, writing DEEP_LINE, 50000 `[` then `]`, on the worker's result socket as
    the harness drops its model), then an honest numpy ReLU. Before (main at 264aee6,
    measured here): `RecursionError` out of `GpuWorkerProcess._read`'s `json.loads` (it caught
    ValueError only) and out of the runner: `verify_batch` turns that into "runtime_error:
    verifier error" (0.1 where the fallback's verdict is a cheat, 0.0). Now it is a malformed
    line (out of the protocol): in a fresh worker the line is the run's own, a cheat (after
    earlier jobs it is run again in a fresh one first); the later honest job correct."""
    from redteam_round13_cases import TORCH_RELU
    from verifier_cases import cpu_loop_jobs

    outs, _ = cpu_loop_jobs([leaving(TORCH_RELU, DEEP_LINE), NUMPY_RELU], "r14deep")
    attacker, later = outs
    assert (attacker.payload or {}).get("outcome") == "cheat", attacker.payload
    assert _ok(later), later.referee


def test_deeply_nested_json_from_a_run_or_a_client_is_refused(tmp_path: Any) -> None:
    """A sandboxed run's `result.json` nested past the parser's depth (the run writes its own
    directory) and a reward-service request body so nested. Before (main at 264aee6, measured
    here): `RecursionError` out of `sandbox.collect_result` (it caught ValueError and OSError);
    the service's body held (a 400, "nested too deeply"). Now the run has no payload (its
    result is missing: the nonce check's case)."""
    from verifier.isolation.sandbox import collect_result
    from verifier.reward.requests import BadRequest, load_json

    deep = "[" * 50000 + "]" * 50000
    (tmp_path / "result.json").write_text(deep)
    assert collect_result(tmp_path, 0, False, 0.1, {}).payload is None
    with pytest.raises(BadRequest) as caught:
        load_json(deep.encode())
    assert caught.value.status == 400 and "nested" in str(caught.value), caught.value


# --- 8. the baseline cache and the build cache, from the worker --------------------------------
def test_the_worker_writes_no_cache_a_later_verdict_reads() -> None:
    """On the real path (`GpuRunner`, cpu loop): an honest numpy ReLU that tries to write the
    baseline cache (`baselines.default_cache_dir()/baselines`: a later candidate's speedup is
    its eager figure), the tests' build cache, the repository and the host's /tmp. Measured
    here: held: none of them written (the worker's mount namespace), the run correct."""
    from pathlib import Path

    from verifier_cases import cpu_loop_jobs

    from verifier.run.baselines import default_cache_dir

    tag = uuid.uuid4().hex
    targets = [str(default_cache_dir() / "baselines" / f"ks_r14_{tag}.json"),
               str(Path.home() / ".cache" / "kernelsynth-tests" / f"ks_r14_{tag}"),
               str(Path(__file__).resolve().parent / f"ks_r14_{tag}"), f"/tmp/ks_r14_{tag}"]
    try:
        outs, _ = cpu_loop_jobs([writer(NUMPY_RELU, targets)], "r14w")
        written = [t for t in targets if os.path.exists(t)]
    finally:
        for t in targets:
            if os.path.exists(t):
                os.remove(t)
    assert not written, written
    assert _ok(outs[0]), outs[0].referee


# --- 9. a C-level signal handler on a POSIX timer ----------------------------------------------
def test_a_c_signal_handler_on_a_posix_timer_slows_no_later_sibling() -> None:
    """On the real path (`GpuRunner`, cpu loop): an honest numpy ReLU, the attacker (an honest
    ReLU leaving POSIX_TIMER: libc `signal(SIGWINCH)` with a ctypes callback that sleeps 8 ms,
    on a 10 ms `timer_create` timer), an honest ReLU. Before (main at 264aee6, measured here):
    no finding, the worker kept; the later honest ReLU correct, timed at 359 us a call against
    75 us before it, nothing run again (`signal.getsignal` and `getitimer` see neither). Now
    the kernel's view (caught signals, /proc/self/timers: `thread_settings.kernel_signals`) is
    compared: the attacker's worker is replaced, the sibling's time its own."""
    from verifier_cases import cpu_loop_jobs

    outs, _ = cpu_loop_jobs([NUMPY_RELU, leaving(NUMPY_RELU, POSIX_TIMER), NUMPY_RELU], "r14pt")
    first, attacker, later = outs
    assert "signal handlers and POSIX timers" in _said(attacker), _said(attacker)
    assert _ok(first) and _ok(later), (first.referee, later.referee)
    fast = [((o.clock or {}).get("figures") or {}).get("runtime_us") for o in (first, later)]
    assert all(fast) and fast[1] < 3 * fast[0] + 100.0, fast


# --- 10. a descriptor dup2'd over the worker's inherited clock pipe ----------------------------
def test_a_clock_pipe_a_job_replaces_hangs_no_later_sibling() -> None:
    """On the real path (`GpuRunner`, cpu loop, a 15 s run timeout): an honest numpy ReLU, the
    attacker (an honest ReLU leaving DUP2_CLOCK: /dev/null `dup2`'d over the worker's end of
    the judge's request pipe), an honest ReLU. Before (main at 264aee6, measured here): no
    finding, the worker kept; the later honest job waited for a "g" that never came, timed out
    after 15 s and was run again in a fresh worker (a run timeout of throughput per attack).
    Now the descriptor table is compared (`thread_settings.descriptors`): the attacker's
    worker is replaced, the sibling correct at once, nothing run again."""
    from verifier_cases import cpu_loop_jobs

    outs, again = cpu_loop_jobs([NUMPY_RELU, leaving(NUMPY_RELU, DUP2_CLOCK), NUMPY_RELU],
                                "r14dup", timeout_s=15.0)
    first, attacker, later = outs
    assert "file descriptors" in _said(attacker), _said(attacker)
    assert _ok(first) and _ok(later) and not later.timed_out, later
    assert again == 0 and not later.confirmed, (again, later.confirmed, later.wall_s)


# --- 11. a C function pointer swapped under a method that keeps its identity --------------------
def test_a_c_method_a_job_repoints_reaches_no_later_job() -> None:
    """On the real path (`GpuRunner`, cpu loop): the attacker (an honest numpy ReLU leaving
    COPY_IS_ADD: `torch.Tensor.copy_`'s PyMethodDef pointed at `add_`'s C function; the
    descriptor object, and so its identity, unchanged), an honest ReLU. Before
    (main at 264aee6, measured here, after an honest job: the same): the attacker correct with
    no finding, the worker kept;
    the later honest job failed by the judge's own check ("trial 1, checked by the verifier
    itself: ... got nan, expected 0.303455": the harness's `slot.copy_(out)` added the output
    to the poison), nothing run again. Now a builtin's or a C method's identity includes its C
    function (`tamper.c_function_pointer`) and the classes' C bases are compared
    (`tamper.class_attributes`): the attacker is a cheat (a harness function changed), the
    later job correct."""
    from verifier_cases import cpu_loop_jobs

    outs, _ = cpu_loop_jobs([leaving(NUMPY_RELU, COPY_IS_ADD), NUMPY_RELU], "r14cp")
    attacker, later = outs
    assert (attacker.payload or {}).get("outcome") == "cheat", attacker.payload
    assert "copy_" in str((attacker.payload or {}).get("error")), attacker.payload
    assert _ok(later), later.referee


def test_a_numpy_loop_a_job_repoints_reaches_no_later_job() -> None:
    """The same in numpy: MAXIMUM_IS_MINIMUM (`np.maximum`'s float32 inner loop, in its ufunc's
    `functions` table, pointed at `np.minimum`'s) left by an honest numpy ReLU, then an honest
    one. Before (main at 264aee6, measured here, after an honest job): the attacker correct
    with no finding;
    the later honest ReLU failed by the judge's own check ("trial 1, checked by the verifier
    itself: output 0: 65535 of 65536 elements differ ...: got -1.0856, expected 0"), nothing
    run again. Now the loop tables are compared (`hidden_state.numpy_loops`): the attacker's
    worker is replaced with the finding on it, the later job correct."""
    from verifier_cases import cpu_loop_jobs

    outs, _ = cpu_loop_jobs([leaving(NUMPY_RELU, MAXIMUM_IS_MINIMUM), NUMPY_RELU], "r14np")
    attacker, later = outs
    assert "numpy ufunc loops" in _said(attacker), _said(attacker)
    assert _ok(attacker) and _ok(later), (attacker.referee, later.referee)


# --- 12-13. the trial report at "t" (main's early trial check, merged at e6e0878) ---------------
def test_a_report_nested_past_the_parsers_depth_is_the_runs_not_the_verifiers(
        tmp_path: Any) -> None:
    """The worker's "t <bytes>" with a report of 50000 `[` then `]` (valid JSON no parser
    takes: RecursionError, a RuntimeError). Before (attack14 with e6e0878 merged, measured
    here): the clock's `judge_error` "the verifier's timing judge failed: maximum recursion
    depth exceeded ..." (the verifier's failure, not the run's), no trials checked at "t"
    (`trials` None: the run's own report at its end checked instead). Now the report is one
    that is not JSON: the trial judge checks it as missing, and no judge error is made."""
    from test_early_trials import _serve, _Trials

    body = b"[" * 50000 + b"]" * 50000
    trials = _Trials(False)
    result, calls, orders = _serve(tmp_path, trials, f"t {len(body)}\n".encode(), body)
    assert result["judge_error"] == "", result
    assert trials.seen == [(None, None)] and result["trials"][0] is False, result
    assert orders == [b"e\n"] and calls["n"] == 0, (orders, calls)


def test_told_early_its_trials_failed_a_run_gets_no_second_draw_as_host_construction() -> None:
    """Through the stages' construction rule (`stages.run_constructed`, `GpuRunner` on the cpu
    loop): REROLL, an honest numpy ReLU plus 0.5 on its first run; when its forward was called
    no more after its trials (the clock said "e" right after "t": its trials failed), its
    model's `__del__` rewrites the result's outcome to the worker's HOST_ONLY (the parent runs
    the job again with the host's construction), and its second run (a marker file) is right.
    Measured here (attack14 with e6e0878 merged): held: the judge's answer at "t" is the
    verdict (`outcome._trials_failed`: `incorrect`), the job is not run again."""
    from types import SimpleNamespace

    from verifier_cases import loop_runner, relu_task

    from verifier.judge.construct import DEVICE
    from verifier.stages import run_constructed

    mark = f"/dev/shm/ks_r14_mark_{uuid.uuid4().hex}"
    runner, job_of = loop_runner(60)
    item = SimpleNamespace(req=SimpleNamespace(task_source=relu_task(256, 256), task_id="relu"),
                           built={}, specs=[], code=reroll(mark), timing={},
                           verdict=SimpleNamespace(findings=[]))
    job = job_of("r14rr-0")
    try:
        out, ran = run_constructed(item, runner, job, None)
    finally:
        runner.close()
        if os.path.exists(mark):
            os.remove(mark)
    rules = [f.get("rule") for f in (out.payload or {}).get("findings", ())]
    assert "r14_forged" in rules, rules  # the run did rewrite its outcome
    assert ran["options"]["construct"] == DEVICE and ran["nonce"] == "r14rr-0", ran
    assert (out.payload or {}).get("outcome") == "incorrect", out.payload
    assert "checked by the verifier itself" in out.payload["error"], out.payload


def test_a_run_told_its_trials_passed_cannot_void_its_slow_windows() -> None:
    """On the real path (`GpuRunner`, cpu loop): an honest ReLU that imports `wave` (a real
    module stays in its worker), then VOIDS_SLOW: correct; in a worker that ran an earlier job
    (`wave` loaded) its timed calls are slow (a 3 ms sleep a call stands for the host's load)
    and after a few judged windows it exits (its own failure). Measured here (attack14 with
    e6e0878 merged): the run made again in a fresh worker ("run again in a fresh worker: its
    first worker had run earlier jobs, and the worker failed (worker exited with code 3)"),
    where its calls are fast: the verdict's runtime 68 us a call, where the judge had timed
    its first run's windows at ~3300 us: a second timing draw, taken only when the first was
    bad. (Not new with the early check: a run that trusts its own kernel can do it without
    the judge's word; the early "pass" only confirms that the windows are all that is left.)
    Now the first run's fastest checked window holds the second run's runtime
    (`outcome.held_to_first`, session 24)."""
    from verifier_cases import cpu_loop_jobs

    outs, _ = cpu_loop_jobs([WAVE_RELU, VOIDS_SLOW], "r14void")
    attacker = outs[1]
    assert _ok(attacker), attacker.referee
    figures = (attacker.clock or {}).get("figures") or {}
    runtime = figures.get("runtime_us") or 0.0
    assert not runtime or runtime > 3000.0, (runtime, attacker.confirmed)
    if attacker.confirmed:  # made again: the fresh run was fast, held to the first's windows
        assert figures.get("fresh_runtime_us", 1e9) < 3000.0 and "held_to_first_windows" in \
            [f["rule"] for f in attacker.payload["findings"]], (figures, attacker.payload)


def test_the_variants_a_verdict_records_are_the_ones_the_judge_checked_at_t(
        tmp_path: Any) -> None:
    """The run's report at "t" says it checked no variant (`variants_checked` [False]: the
    judge's reference cannot run it), and its result at the end says it did ([True]: the
    verdict's `generalised` finding, a parent rule no worker finding may carry, names the
    variants the end's list marks). Before (attack14 with e6e0878 merged, measured here):
    the judge checked [False] at "t" (`clock.trials`), and `GpuRunner._judged_here` left the
    end's [True] in the payload `stages.record_generalisation` reads: a claim of
    generalisation no one checked. Now the payload says what was checked at "t"."""
    import json
    from types import SimpleNamespace

    from test_early_trials import _serve, _Trials

    from verifier.protocol import VerifyOptions
    from verifier.run.gpu_runner import GpuRunner
    from verifier.run.outcome import RunOutcome

    body = json.dumps({"trial_report": {"values": [[[], [], []], []]},
                       "variants_checked": [False]}).encode()
    result, _, _ = _serve(tmp_path, _Trials(True), f"t {len(body)}\n".encode(), body)
    assert result["trials"][0] is True, result
    out = RunOutcome({"nonce": "n1", "outcome": "ok", "findings": [],
                      "variants_checked": [True], "trial_report": {"values": []}},
                     clock=result)
    judged = GpuRunner._judged_here(SimpleNamespace(opts=VerifyOptions(trials=3)), out,
                                    SimpleNamespace(spec={"trials": 3}))
    assert judged.payload["variants_checked"] == [False], judged.payload
    assert judged.referee is not None and judged.referee("run", {})[0] is True
