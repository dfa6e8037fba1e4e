"""The reference's pace end to end, through `verify_batch` on the persistent worker's loop (the
cpu backend as `GpuRunner` drives it, as on a GPU): a correct candidate far slower than eager
is settled after one timed window, and a hanging one is ended at its step's hang deadline,
not at the run timeout (`verifier.judge.pace`, `verifier.run.hang_watch`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from verifier.api import verify_batch
from verifier.backends.cpu import CpuBackend
from verifier.protocol import VerifyOptions, VerifyRequest

sys.path.insert(0, str(Path(__file__).parent))
from verifier_cases import RELU_LOOP, RELU_TASK, relu_candidate  # noqa: E402

pytestmark = pytest.mark.heavy  # out of the default run: CI runs it (-m heavy)

CACHE = Path.home() / ".cache" / "kernelsynth-tests" / "verifier-builds"
BODY = RELU_LOOP.format(fn="relu_fwd", pragma="")  # the build other tests cached
SLOW = relu_candidate(BODY, extra="import time\n",
                      forward="time.sleep(0.1)\n        return ext.relu_fwd(x)")
HANG = relu_candidate(BODY, forward="y = ext.relu_fwd(x)\n        while y is not None:\n"
                      "            y = y\n        return y")


def test_a_slow_candidate_is_settled_and_a_hanging_one_ends_at_its_deadline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CpuBackend, "persistent_worker", True)
    opts = VerifyOptions(backend="cpu", workers=1, compile_workers=1, run_timeout_s=60.0,
                         trials=3, build_cache_dir=str(CACHE),
                         baseline_cache_dir=str(tmp_path / "bl"))
    timings: dict = {}
    v = {x.candidate_id: x for x in verify_batch(
        [VerifyRequest("slow", "relu", RELU_TASK, SLOW, "cpu"),
         VerifyRequest("hang", "relu", RELU_TASK, HANG, "cpu")], opts, timings=timings)}
    slow, hang = v["slow"], v["hang"]
    assert slow.status == "correct_slow", (slow.status, slow.error)
    settled = [f for f in slow.findings if f["rule"] == "timing_settled"]
    assert settled and settled[0]["severity"] == "info", slow.findings
    clock = timings["slow"]["judge_clock"]
    assert clock["calls"] == 1 and len(clock["windows_us"]) == 1 and clock["early_stop"]
    assert slow.runtime_us >= 100_000 and slow.speedup is not None and slow.speedup < 1 / 3
    # each trial sleeps 0.1 s: the profile's call seconds, as the parent saw the worker's lines
    # (a step's line read late by a busy parent shortens it; the landing CI measured 98.5 ms)
    calls = timings["slow"]["spans"]
    assert calls["first_call"] >= 0.09 and calls["call_max"] >= 0.09, calls
    assert hang.status == "timeout", (hang.status, hang.error)
    assert "passed its hang deadline: trial: one call (the first) may take" in hang.error, \
        hang.error
    assert "the run timeout is 60 s" in hang.error
    assert timings["hang"]["exec_s"] < 30.0  # a floor and a first call past its load, not 60 s
