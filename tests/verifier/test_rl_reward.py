"""The TRL reward function over verify_batch (cpu backend, the relu task)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from verifier.protocol import CORRECT_STATUSES, VerifyOptions
from verifier.reward.rl_reward import KernelReward, RewardInputError, completion_text, requests_for

sys.path.insert(0, str(Path(__file__).parent))
from verifier_cases import MARKDOWN, RELU_TASK, relu_ok  # noqa: E402

CACHE = Path.home() / ".cache" / "kernelsynth-tests" / "verifier-builds"
FAST = VerifyOptions(backend="cpu", build_cache_dir=str(CACHE), trials=2, perf_trials=5,
                     perf_budget_s=0.5)
TORCH_RELU = relu_ok().replace("return ext.relu_fwd(x)", "return torch.relu(x)")


def test_completion_text_takes_strings_and_assistant_messages() -> None:
    assert completion_text("```python\nx = 1\n```") == "```python\nx = 1\n```"
    conv = [{"role": "assistant", "content": "answer"}]
    assert completion_text(conv) == "answer"
    parts = [{"role": "assistant", "content": [{"type": "text", "text": "a"},
                                               {"type": "text", "text": "b"}]}]
    assert completion_text(parts) == "ab"
    assert completion_text([{"role": "user", "content": "q"},
                            {"role": "assistant", "content": "x"}]) == "x"
    with pytest.raises(RewardInputError, match="completion 3: expected a string or a list"):
        completion_text(42, 3)
    with pytest.raises(RewardInputError, match="completion 0: a message without 'content'"):
        completion_text([{"role": "assistant"}])


def test_requests_need_the_reference_column() -> None:
    with pytest.raises(RewardInputError, match="'reference' or 'task_source' column"):
        requests_for(["x"], {"task_id": ["t"]})
    with pytest.raises(RewardInputError, match="2 completions but 1 references"):
        requests_for(["x", "y"], {"reference": [RELU_TASK]})
    with pytest.raises(RewardInputError, match="completion 1: the reference is not a KernelBench "
                                               "task file: it defines no Model"):
        requests_for(["x", "y"], {"reference": [RELU_TASK, "import torch\nx = 1\n"]})
    reqs = requests_for(["a", "a"], {"reference": [RELU_TASK] * 2, "task_id": ["t1", "t1"],
                                     "backend": ["cuda", "cuda"]})
    assert [r.task_id for r in reqs] == ["t1", "t1"] and reqs[0].backend == "cuda"
    assert len({r.candidate_id for r in reqs}) == 2  # same text twice: still two candidates


def test_reward_is_the_hierarchical_reward_of_each_completion() -> None:
    logged: dict[str, float] = {}
    extra: dict[str, list] = {}
    reward = KernelReward(FAST)
    prompt = [{"role": "user", "content": "Write ModelNew"}]
    completions = [[{"role": "assistant", "content": MARKDOWN}], "no code here",
                   [{"role": "assistant", "content": f"```python\n{TORCH_RELU}```"}]]
    rewards = reward([prompt] * 3, completions, reference=[RELU_TASK] * 3,
                     task_id=["relu"] * 3, backend=["cuda"] * 3,  # rows built for cuda
                     log_metric=lambda k, v: logged.__setitem__(k, v),
                     log_extra=lambda k, v: extra.__setitem__(k, v))
    statuses = [v.status for v in reward.last_verdicts]
    assert statuses[1:] == ["format_error", "static_reject"], statuses
    assert statuses[0] in CORRECT_STATUSES, reward.last_verdicts[0].error
    assert rewards[1:] == [0.0, 0.0] and 0.5 < rewards[0] <= 1.0
    assert rewards == [v.reward for v in reward.last_verdicts]
    assert {v.backend for v in reward.last_verdicts} == {"cpu"}  # options override the rows
    assert logged["kernel_reward/correct"] == pytest.approx(1 / 3)
    assert extra["kernel_reward_status"] == statuses
