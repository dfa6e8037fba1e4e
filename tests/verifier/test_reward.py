"""Reward hierarchy and feedback text, computed from verdicts."""

from __future__ import annotations

import json

from verifier.protocol import STATUSES, VerdictData
from verifier.reward import finalize


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
