"""The README's vLLM offline recipe, end to end, with a stub `vllm` package in place of vLLM.

export prompts -> scripts/vllm_generate.py (LLM.generate) -> generate --generator import ->
verify (real CPU verifier) -> publish: the rft config carries the group statistics.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.workspace import Workspace
from schemas import Task

sys.path.insert(0, str(Path(__file__).parents[2] / "verifier"))
from verifier_cases import RELU_TASK, relu_ok  # noqa: E402

ROOT = Path(__file__).parents[3]
CACHE = Path.home() / ".cache" / "kernelsynth-tests" / "verifier-builds"

# vLLM's offline API as the recipe uses it: LLM(model=...), get_tokenizer().apply_chat_template,
# generate(prompts, SamplingParams) -> [RequestOutput(prompt, prompt_token_ids, outputs=[
# CompletionOutput(text, token_ids, finish_reason)])]
STUB = '''
import json
from types import SimpleNamespace

ANSWERS = json.loads({answers!r})


class SamplingParams:
    def __init__(self, n=1, temperature=1.0, top_p=1.0, max_tokens=16, seed=None):
        self.n, self.temperature, self.top_p, self.max_tokens = n, temperature, top_p, max_tokens


class _Tokenizer:
    def apply_chat_template(self, messages, tokenize=True, add_generation_prompt=False):
        assert tokenize is False and add_generation_prompt is True
        text = "".join(f"<|im_start|>{{m['role']}}\\n{{m['content']}}<|im_end|>\\n"
                       for m in messages)
        return text + "<|im_start|>assistant\\n"


class LLM:
    def __init__(self, model, **kwargs):
        self.model = model

    def get_tokenizer(self):
        return _Tokenizer()

    def generate(self, prompts, params):
        return [SimpleNamespace(prompt=p, prompt_token_ids=list(range(len(p.split()))),
                                outputs=[SimpleNamespace(text=ANSWERS[j % len(ANSWERS)],
                                                         token_ids=[0] * (10 + j),
                                                         finish_reason="stop")
                                         for j in range(params.n)])
                for p in prompts]
'''


def _invoke(*args: str) -> dict:
    res = CliRunner().invoke(app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads([ln for ln in res.stdout.splitlines() if ln.startswith("{")][-1])


@pytest.mark.slow  # a real CPU verify of three candidates: ~30-90 s
def test_vllm_offline_recipe_with_stub(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "ws")
    ws.new_run().write([Task(task_id="t_relu", name="relu", source=RELU_TASK,
                             cpu_source=RELU_TASK)])
    good = relu_ok()
    answers = [f"The op is elementwise, so one loop suffices.\n\n```python\n{good}```\n",
               "Keep it in PyTorch:\n\n```python\n"
               + good.replace("return ext.relu_fwd(x)", "return torch.relu(x)") + "```\n",
               "I am not sure this can be done."]
    stub = tmp_path / "stub" / "vllm"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text(STUB.format(answers=json.dumps(answers)))
    conf = tmp_path / "kernelsynth.yaml"
    conf.write_text(json.dumps({"verify": {
        "backend": "cpu", "build_cache_dir": str(CACHE), "run_timeout_s": 30, "perf_trials": 3,
        "perf_warmup": 1, "baseline_cache_dir": str(tmp_path / "bl")}}))
    common = ["--workspace", str(ws.root), "--config", str(conf)]

    prompts, samples = tmp_path / "prompts.jsonl", tmp_path / "samples.jsonl"
    assert _invoke("prompts", "export", "--out", str(prompts), "--backend", "cpu",
                   *common)["prompts"] == 1
    subprocess.run([sys.executable, str(ROOT / "scripts" / "vllm_generate.py"), "--model",
                    "stub/coder-7b", "--prompts", str(prompts), "--out", str(samples), "--n",
                    "3", "--temperature", "0.7"], check=True, cwd=tmp_path,
                   env={"PYTHONPATH": str(stub.parent), "PATH": "/usr/bin:/bin"})
    rows = [json.loads(ln) for ln in samples.read_text().splitlines()]
    assert len(rows) == 3 and rows[0]["prompt"].startswith("<|im_start|>system")
    assert _invoke("generate", "--generator", "import", "--samples", str(samples),
                   "--backend", "cpu", *common)["candidates"] == 3
    assert _invoke("verify", *common)["verified"] == 3
    _invoke("publish", *common)
    (version,) = (ws.root / "datasets" / "kernelsynth").iterdir()
    rft = pq.read_table(next((version / "rft").glob("train-*.parquet"))).to_pylist()
    assert len(rft) == 1
    row = rft[0]
    assert row["generator"] == "import:stub/coder-7b" and row["group_size"] == 3
    assert abs(row["group_pass_rate"] - 1 / 3) < 1e-9 and row["group_std_reward"] > 0
    assert row["messages"][-1]["content"].startswith("The op is elementwise")
    card = (version / "README.md").read_text()
    assert "`import:stub/coder-7b` (1)" in card
