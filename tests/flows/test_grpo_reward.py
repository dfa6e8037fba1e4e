"""One GRPOTrainer step on the published `rl` config with the verifier's reward (TRL, CPU).

The model is a tiny randomly initialised Llama and the tokenizer a byte-level BPE trained here on
a few lines, so nothing is downloaded. A random model writes no kernel, so every completion is a
format error with reward 0; what the step proves is the contract: TRL calls the reward with the
rl rows' columns, the reward verifies every completion in one batch and its values reach the
trainer's logs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("trl")

CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")


def _tiny_tokenizer(texts: list[str]):  # noqa: ANN202
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<pad>", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


@pytest.mark.slow
def test_one_grpo_step_with_the_kernel_reward(tmp_path: Path, monkeypatch) -> None:
    import datasets
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from pipeline.config import Config
    from pipeline.datasets.publish import publish_workspace
    from pipeline.workspace import Workspace
    from tests.pipeline.ks_synthetic import fill_workspace, hf_offline
    from verifier.protocol import VerifyOptions
    from verifier.reward.rl_reward import KernelReward

    ws = Workspace(tmp_path / "ws")
    fill_workspace(ws, n_tasks=2)
    version = publish_workspace(ws, Config(workspace=str(ws.root)))
    cache = hf_offline(monkeypatch, tmp_path)
    rl = datasets.load_dataset(str(version), name="rl", split="train", cache_dir=str(cache))
    rl = rl.select(range(2))
    assert {"prompt", "reference", "task_id", "backend"} <= set(rl.column_names)

    texts = [json.dumps(m) for row in rl for m in row["prompt"]] + list(rl["reference"])
    tokenizer = _tiny_tokenizer(texts)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=8192, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    model = LlamaForCausalLM(config)

    calls: list[dict] = []
    reward = KernelReward(VerifyOptions(backend="cpu", trials=1, perf_trials=3))

    def kernel_reward(prompts, completions, **kwargs):  # noqa: ANN001, ANN202
        calls.append({"n": len(completions), "columns": set(kwargs),
                      "task_ids": list(kwargs["task_id"])})
        return reward(prompts, completions, **kwargs)

    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2,
                      num_generations=2, max_completion_length=8, max_steps=1,
                      logging_steps=1, report_to=[], use_cpu=True, bf16=False,
                      save_strategy="no", seed=0)
    trainer = GRPOTrainer(model=model, reward_funcs=[kernel_reward], args=args,
                          train_dataset=rl, processing_class=tokenizer)
    trainer.train()

    assert calls and calls[0]["n"] == 2
    assert {"reference", "task_id", "backend"} <= calls[0]["columns"]
    assert set(calls[0]["task_ids"]) <= set(rl["task_id"])
    statuses = [v.status for v in reward.last_verdicts]
    assert len(statuses) == 2 and set(statuses) <= {"format_error"}, statuses
    logged = [h for h in trainer.state.log_history if "rewards/kernel_reward/mean" in h]
    assert logged and logged[0]["rewards/kernel_reward/mean"] == 0.0
