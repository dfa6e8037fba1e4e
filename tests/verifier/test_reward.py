"""Reward hierarchy and feedback text, computed from verdicts."""

from __future__ import annotations

import json

from verifier.judge.reward import finalize, speedup_of
from verifier.protocol import STATUSES, VerdictData


def _v(status: str, **kw) -> VerdictData:
    return finalize(VerdictData("c", "t", status, "done", "cpu", **kw))


def test_reward_is_hierarchical() -> None:
    order = ["format_error", "compile_error", "runtime_error", "incorrect"]
    rewards = [_v(s).reward for s in order]
    assert rewards == sorted(rewards) and len(set(rewards)) == len(rewards)
    slow = _v("correct_slow", speedup=0.5, runtime_us=2.0, eager_us=1.0)
    fast = _v("correct_fast", speedup=3.0, runtime_us=1.0, eager_us=3.0)
    assert _v("incorrect").reward < 0.5 <= slow.reward < fast.reward <= 1.0
    assert _v("cheat").reward == 0.0 and _v("static_reject").reward == 0.0
    assert json.loads(fast.reward_components)["speed"] == 1.0


def test_every_status_has_feedback() -> None:
    for s in STATUSES:
        assert _v(s).feedback


def test_feedback_contents() -> None:
    v = _v("compile_error", compile_log="candidate.py:12:5: error: expected ';'\nnote: x")
    assert "candidate.py:12:5: error" in v.feedback
    v = _v("incorrect", error="trial 1: output 0: 3 of 8 elements differ", max_abs_diff=1.5,
           mean_abs_diff=0.2, mismatch_frac=0.375)
    assert "max abs diff 1.5" in v.feedback and "0.375" in v.feedback
    v = _v("static_reject", findings=[{"rule": "torch_compute", "message": "torch.relu()",
                                       "line": 7}])
    assert "torch_compute" in v.feedback and "line 7" in v.feedback
    v = _v("correct_fast", speedup=2.0, runtime_us=5.0, eager_us=10.0)
    assert "2.00x faster" in v.feedback


def test_zero_speedup_is_a_speedup_not_a_missing_timing() -> None:
    # issue 28: a kernel repeating its work 6000x got speedup 0.0 after rounding and the
    # "no timing" reward 0.75, above an honest 0.51x kernel
    crawl = _v("correct_slow", speedup=0.0, runtime_us=6000.0, eager_us=0.1)
    honest = _v("correct_slow", speedup=0.51, runtime_us=2.0, eager_us=1.02)
    untimed = _v("correct_slow")
    assert crawl.reward == 0.5 < honest.reward < untimed.reward == 0.75
    assert json.loads(crawl.reward_components)["speed"] == 0.0


def test_tiny_speedups_keep_significant_digits() -> None:
    s = speedup_of(1.0, 6000.0)
    assert s is not None and s > 0 and abs(s - 1 / 6000) / (1 / 6000) < 1e-3
    assert speedup_of(3.0, 1.0) == 3.0 and speedup_of(2.0, 3.0) == 0.6667
    assert speedup_of(None, 1.0) is None and speedup_of(1.0, 0.0) is None
    slow = _v("correct_slow", speedup=s, runtime_us=6000.0, eager_us=1.0)
    assert 0.5 < slow.reward < _v("correct_slow", speedup=0.01, runtime_us=100.0,
                                  eager_us=1.0).reward
    assert "0.00017x the speed" in slow.feedback
