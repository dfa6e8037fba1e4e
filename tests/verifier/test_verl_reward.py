"""verl's custom reward function, loaded by file path and called as verl's reward managers do.

verl's `custom_reward_function.path` loads a file with importlib and takes a function by name;
the naive manager calls it per sample with keyword arguments (data_source, solution_str,
ground_truth, extra_info), the batch manager once per batch (data_sources, solution_strs,
ground_truths, extra_infos). Both are exercised here on real CPU relu candidates, in-process and
through the reward service.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from pathlib import Path

import pytest

from verifier.protocol import VerifyOptions
from verifier.reward.rl_reward import RewardInputError
from verifier.reward.server import RewardServer, RewardService, ServiceLimits

sys.path.insert(0, str(Path(__file__).parent))
from verifier_cases import MARKDOWN, RELU_LOOP, RELU_TASK, relu_candidate  # noqa: E402

MODULE = Path(__file__).parents[2] / "verifier" / "reward" / "verl_reward.py"
CACHE = Path.home() / ".cache" / "kernelsynth-tests" / "verifier-builds"
WRONG = "```python\n" + relu_candidate(RELU_LOOP.format(fn="relu_wrong", pragma="").replace(
    "o[i] = in[i] > 0.f ? in[i] : 0.f;", "o[i] = in[i] > 0.f ? 0.f : in[i];"),
    "relu_wrong") + "```"


def _load(name: str):  # noqa: ANN202
    """The function `name` of the file, loaded the way verl's get_custom_reward_fn does."""
    spec = importlib.util.spec_from_file_location("custom_module", MODULE)
    module = importlib.util.module_from_spec(spec)
    saved = sys.modules.get("custom_module")
    sys.modules["custom_module"] = module  # as verl registers it before exec_module
    try:
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            sys.modules.pop("custom_module", None)
        else:
            sys.modules["custom_module"] = saved
    return getattr(module, name)


def test_batch_form_in_process_orders_correct_over_wrong(monkeypatch) -> None:
    monkeypatch.delenv("KERNELSYNTH_REWARD_URL", raising=False)
    monkeypatch.setenv("KERNELSYNTH_BACKEND", "cpu")
    compute_score_batch = _load("compute_score_batch")
    scores = compute_score_batch(
        data_sources=["kernelsynth"] * 3, solution_strs=[MARKDOWN, WRONG, "I cannot."],
        ground_truths=[RELU_TASK] * 3,
        extra_infos=[{"task_id": "relu", "backend": "cuda"}, {"task_id": "relu"}, None],
        # verl's custom_reward_function.reward_kwargs: options of the in-process verifier
        build_cache_dir=str(CACHE), trials=2, perf_trials=5, perf_budget_s=0.5, lr=1e-6)
    assert 0.5 < scores[0] <= 1.0, scores  # correct: 0.5 and up, scaled by speed
    assert scores[1] == pytest.approx(0.2), scores  # compiled and ran, wrong output
    assert scores[2] == 0.0  # no code


def test_per_sample_form_through_the_reward_service(monkeypatch) -> None:
    opts = VerifyOptions(backend="cpu", build_cache_dir=str(CACHE), trials=2, perf_trials=5,
                         perf_budget_s=0.5)
    server = RewardServer("127.0.0.1", 0, RewardService(opts, ServiceLimits(max_concurrency=1)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("KERNELSYNTH_REWARD_URL", server.url)
        monkeypatch.setenv("KERNELSYNTH_BACKEND", "cpu")
        compute_score = _load("compute_score")
        good = compute_score(data_source="kernelsynth", solution_str=MARKDOWN,
                             ground_truth=RELU_TASK, extra_info={"task_id": "relu"})
        bad = compute_score(data_source="kernelsynth", solution_str=WRONG,
                            ground_truth=RELU_TASK, extra_info=None)
        assert 0.5 < good <= 1.0 and bad == pytest.approx(0.2), (good, bad)
        # a ground truth that is not a task file is refused before anything runs
        with pytest.raises(RewardInputError, match="is not a KernelBench task file"):
            compute_score(data_source="x", solution_str=MARKDOWN, ground_truth="x = 1\n")
    finally:
        server.shutdown()
        server.server_close()


def test_settings_are_checked(monkeypatch) -> None:
    compute_score = _load("compute_score")
    monkeypatch.setenv("KERNELSYNTH_BACKEND", "gpu")
    with pytest.raises(RewardInputError, match="KERNELSYNTH_BACKEND='gpu'"):
        compute_score("k", "no code", RELU_TASK)
    monkeypatch.setenv("KERNELSYNTH_BACKEND", "cpu")
    monkeypatch.setenv("KERNELSYNTH_REWARD_TIMEOUT", "nan")
    with pytest.raises(RewardInputError, match="KERNELSYNTH_REWARD_TIMEOUT='nan'"):
        compute_score("k", "no code", RELU_TASK)
    monkeypatch.setenv("KERNELSYNTH_REWARD_TIMEOUT", "60")
    with pytest.raises(RewardInputError, match="reward_kwargs trials='2': expected int"):
        compute_score("k", "no code", RELU_TASK, trials="2")
