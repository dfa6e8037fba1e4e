"""Red-team round 13 on the cpu backend: attacks on branch attack13 at 233ec5c, as a policy
rewarded for holes would try them (cases in tests/verifier/redteam_round13_cases.py). Each was
measured first (the "Before" of each test); an open one is a strict xfail naming its fix.

Targets: this session's new code (the judge's fp32 fast pass `device_compare._within`, the
clock's unchecked windows after a failed one, stepped trials, the import residue) and residue
routes of the persistent worker that no getter shows. Closed here (`verifier.run.hidden_state`,
compared by `tamper.process_state`): the main thread's floating-point environment (rounding
mode, flush-to-zero) and the codecs search path.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from redteam_round13_cases import (
    CODEC_SEARCH,
    CUMSUM_TASK,
    FLUSH_DENORMAL,
    NUMPY_CUMSUM,
    ROUND_UP,
    leaving_cumsum,
)


def _loop(sources: list[str], task: str, prefix: str = "r13") -> tuple[list[Any], int]:
    """`verifier_cases.cpu_loop_jobs` for any task: one `GpuRunner` (cpu loop, the judge's
    arena and clock), a job per source in order; the outcomes and the runs made again."""
    from verifier.judge.construct import DEVICE
    from verifier.judge.inputs import trial_input_seed
    from verifier.protocol import VerifyOptions
    from verifier.run.gpu_runner import GpuRunner
    from verifier.stages import JOB_OPTIONS

    opts = VerifyOptions(backend="cpu", workers=1, run_timeout_s=60.0, trials=2,
                         perf_trials=2, perf_warmup=1)
    runner = GpuRunner(opts, {}, "cpu")
    outs = []
    try:
        for i, src in enumerate(sources):
            item = SimpleNamespace(req=SimpleNamespace(task_source=task, task_id="t13"),
                                   built={}, specs=[], code=src)
            job = {"nonce": f"{prefix}-{i}", "backend": "cpu", "input_seed": trial_input_seed(),
                   "variants": [], "options": {**{k: getattr(opts, k) for k in JOB_OPTIONS},
                                               "construct": DEVICE}}
            outs.append(runner.run(item, job))
    finally:
        runner.close()
    return outs, runner.confirmations


def _said(out: Any) -> str:
    return " ".join(f.get("message", "") for f in (out.payload or {}).get("findings", ()))


# --- 1-3. residue no getter shows: the floating-point environment, the codecs registry --------
@pytest.mark.parametrize("route", ["round_up", "flush_denormal", "codec_search"])
def test_hidden_process_state_is_residue(route: str) -> None:
    """Each route planted in this process is seen by the residue check. Before (main at
    233ec5c, measured here): `left_in_process` empty for all three (`fesetround(FE_UPWARD)`
    through libm, `torch.set_flush_denormal(True)`, `codecs.register` of a search function),
    and `gpu_worker.global_flags` unchanged. Now `verifier.run.hidden_state` reads the
    rounding and denormal modes by their effect on Python's float arithmetic and the codecs
    search path as the referrer list of `encodings.search_function`."""
    import codecs
    import ctypes

    import torch

    from verifier.run.tamper import left_in_process, process_state

    libm = ctypes.CDLL("libm.so.6")
    before = process_state()
    fn = None
    try:
        if route == "round_up":
            libm.fesetround(0x800)
        elif route == "flush_denormal":
            torch.set_flush_denormal(True)
        else:
            def fn(name: str) -> None:
                return None
            codecs.register(fn)
        left = left_in_process(before)
    finally:
        libm.fesetround(0)
        torch.set_flush_denormal(False)
        if fn is not None:
            codecs.unregister(fn)
    assert left, route
    assert not left_in_process(before), left_in_process(before)  # restored: nothing left


def test_rounding_left_upward_does_not_fail_a_later_honest_sibling() -> None:
    """An honest numpy cumsum (sequential fp32 accumulation; torch's reference accumulates in
    double), the same as the attacker leaving the worker's main thread rounding upward
    (ROUND_UP: `fesetround(FE_UPWARD)`, one libm call), the honest one again. Before (main at
    233ec5c, measured here): the first two correct with no finding; the third "trial 1,
    checked by the verifier itself: output 0: 100043 of 131072 elements differ ... (against an
    fp64 reference too: error 0.0601; ... fp16-precision inputs would give 0.0388)" and its
    timed call wrong (a cheat), nothing run again: the judge's own failure stands. Now the
    attacker's worker is replaced, the finding on the attacker, the sibling correct."""
    outs, again = _loop([NUMPY_CUMSUM, leaving_cumsum(ROUND_UP), NUMPY_CUMSUM], CUMSUM_TASK)
    for out in outs:
        assert out.referee is not None and out.referee("run", {})[0], out.referee("run", {})
        assert (out.clock or {}).get("failure") == "", out.clock
    assert "floating-point environment" in _said(outs[1]), _said(outs[1])
    assert again == 0


def test_flush_denormal_is_charged_to_the_job_that_left_it() -> None:
    """`torch.set_flush_denormal(True)` (public torch API: the static checks see only a torch
    call) left by the attacker's model. Before (measured here): no finding, the worker kept.
    Now the attacker's worker is replaced with the finding on it; its sibling correct."""
    outs, _ = _loop([leaving_cumsum(FLUSH_DENORMAL), NUMPY_CUMSUM], CUMSUM_TASK, "r13fd")
    assert "floating-point environment" in _said(outs[0]), _said(outs[0])
    assert outs[1].referee is not None and outs[1].referee("run", {})[0]


def test_a_codec_search_function_is_charged_to_the_job_that_left_it() -> None:
    """CODEC_SEARCH (a search function on the codecs path: called at any later lookup of a
    new encoding, in any later job) left by an honest numpy cumsum. Before (measured here): no
    finding, the worker kept. Now its worker is replaced, the finding on it."""
    outs, _ = _loop([leaving_cumsum(CODEC_SEARCH), NUMPY_CUMSUM], CUMSUM_TASK, "r13cs")
    assert "codecs search path" in _said(outs[0]), _said(outs[0])
    assert outs[1].referee is not None and outs[1].referee("run", {})[0]
