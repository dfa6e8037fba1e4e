"""verl and OpenRLHF scoring the published `rl` config, as the GRPO step test does with TRL.

Rows come from a published version loaded with `datasets`; each trainer gets them in its own
form. verl: `reward_model.ground_truth` = the row's `reference`, `extra_info` = task_id and
backend, and the function file loaded by path as verl's `get_custom_reward_fn` loads it, called
per sample (naive manager) and per batch (batch manager, with reward_kwargs). OpenRLHF: the
prompt rendered by a chat template, `query` = prompt + response, `labels` = the row's reference
(`--label_key reference`), POSTed as OpenRLHF's remote_rm_fn posts it to a `python -m verifier
serve` process on loopback; it reads `rewards`. The responses are real CPU kernels for the row's
task (relu times the task's scale), correct and wrong, and a refusal; both paths verify them on
the CPU backend and must agree.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
sys.path.insert(0, str(ROOT / "tests" / "verifier"))
from verifier_cases import RELU_LOOP, relu_candidate  # noqa: E402

CACHE = Path.home() / ".cache" / "kernelsynth-tests" / "verifier-builds"


def _chat(messages: list[dict]) -> str:
    """The prompt as a chat template renders it (role: content lines, then the answer's turn)."""
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "


def _kernel(scale: str, fn: str) -> str:
    """A CPU kernel answer for relu(x) * scale, in a markdown block as a model writes it."""
    body = RELU_LOOP.format(fn=fn, pragma="").replace(
        "in[i] > 0.f ? in[i] : 0.f", f"in[i] > 0.f ? in[i] * {scale}f : 0.f")
    return f"Here is the kernel.\n\n```python\n{relu_candidate(body, fn)}```\n"


def _rl_row(tmp_path: Path, monkeypatch) -> dict:  # noqa: ANN001
    import datasets

    from pipeline.config import Config
    from pipeline.datasets.publish import publish_workspace
    from pipeline.workspace import Workspace
    from tests.pipeline.ks_synthetic import fill_workspace, hf_offline

    ws = Workspace(tmp_path / "ws")
    fill_workspace(ws, n_tasks=2)
    version = publish_workspace(ws, Config(workspace=str(ws.root)))
    cache = hf_offline(monkeypatch, tmp_path)
    rl = datasets.load_dataset(str(version), name="rl", split="train", cache_dir=str(cache))
    row = next(r for r in rl if r["kind"] == "task")
    assert {"prompt", "reference", "task_id", "backend"} <= set(row)
    return row


def _verl_function(name: str):  # noqa: ANN202
    """`name` of verifier/reward/verl_reward.py, loaded as verl's get_custom_reward_fn loads it."""
    spec = importlib.util.spec_from_file_location("custom_module",
                                                  ROOT / "verifier" / "reward" / "verl_reward.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["custom_module"] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop("custom_module", None)
    return getattr(module, name)


def _post(url: str, data: dict) -> tuple[int, dict]:
    """POST JSON as OpenRLHF's request_api_wrapper does (json body, Content-Type header)."""
    req = urllib.request.Request(url, data=json.dumps(data).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.slow
def test_verl_and_openrlhf_score_the_published_rl_rows(tmp_path: Path, monkeypatch) -> None:
    row = _rl_row(tmp_path, monkeypatch)
    scale = re.search(r"torch\.relu\(x\) \* (\d+)", row["reference"]).group(1)
    responses = [_kernel(f"{scale}.0", "scaled_relu"), _kernel("1.0", "unscaled_relu"),
                 "I cannot write this kernel."]
    not_a_task = row["reference"].split("def get_inputs")[0]  # a module file, no inputs

    # verl, in the trainer's process
    monkeypatch.delenv("KERNELSYNTH_REWARD_URL", raising=False)
    monkeypatch.setenv("KERNELSYNTH_BACKEND", "cpu")
    extra = {"task_id": row["task_id"], "backend": row["backend"], "index": 0}
    batch = _verl_function("compute_score_batch")(
        data_sources=["kernelsynth"] * 3, solution_strs=responses,
        ground_truths=[row["reference"]] * 3, extra_infos=[extra] * 3,
        build_cache_dir=str(CACHE), trials=2, perf_trials=5, perf_budget_s=0.5)
    assert 0.5 < batch[0] <= 1.0 and batch[1] == pytest.approx(0.2) and batch[2] == 0.0, batch
    compute_score = _verl_function("compute_score")
    assert compute_score(data_source="kernelsynth", solution_str=responses[2],
                         ground_truth=row["reference"], extra_info=extra) == 0.0
    from verifier.reward.rl_reward import RewardInputError

    with pytest.raises(RewardInputError, match="defines no get_inputs, get_init_inputs"):
        compute_score(data_source="kernelsynth", solution_str=responses[0],
                      ground_truth=not_a_task, extra_info=extra)

    # OpenRLHF, against the reward service as deployed
    proc = subprocess.Popen([sys.executable, "-m", "verifier", "serve", "--port", "0",
                             "--backend", "cpu", "--trials", "2", "--perf-trials", "5",
                             "--cache-dir", str(CACHE), "--max-concurrency", "1"],
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        line = proc.stderr.readline()
        assert "reward service on http://127.0.0.1:" in line, line
        url = line.split(" on ", 1)[1].split()[0] + "/get_reward"
        prompt = _chat(row["prompt"])
        assert row["reference"].strip() in prompt  # the prompt shows the reference's code
        status, data = _post(url, {"query": [prompt + r for r in responses],
                                   "prompts": [prompt] * 3, "labels": [row["reference"]] * 3})
        assert status == 200, data
        assert data["rewards"][1:] == batch[1:] and data["rewards"][1] == pytest.approx(0.2)
        assert 0.5 < data["rewards"][0] <= 1.0, data  # correct; the speed part may differ
        assert data["extra_logs"]["kernel_correct"] == [1.0, 0.0, 0.0]
        status, data = _post(url, {"query": [prompt + responses[0]], "prompts": [prompt],
                                   "labels": [not_a_task]})
        assert status == 400 and data["error"].startswith(
            "sample 0 (label): the task source is not a KernelBench task file: it defines no "
            "get_inputs, get_init_inputs"), data
    finally:
        proc.terminate()
        proc.wait(timeout=30)
