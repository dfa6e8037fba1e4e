"""First on a persistent cpu worker's PYTHONPATH in tests/verifier/test_trial_pace.py: the
worker's profiler reads an own-kernel share of SHARE for every forward (a cpu measures none),
so the cpu loop carries a measured share as the GPU's does. Patched before the worker's
snapshot of the harness: its hygiene checks see it as the harness."""

import verifier.checks.fallback as _fallback

SHARE = 0.25
_measure = _fallback.judge_kernels


def judge_kernels(*args, **kwargs):  # noqa: ANN002, ANN003, ANN201 - the wrapped signature
    names, findings, _, cheat = _measure(*args, **kwargs)
    return names, findings, SHARE, cheat


_fallback.judge_kernels = judge_kernels
