"""Local generation with `transformers`: chat template, left-padded batches, sampling settings.

For a model on this machine (a checkpoint folder or an already-downloaded Hub id); large-scale
sampling belongs on a vLLM/SGLang server (`openai_client.py`), this backend is for small models,
offline runs and tests.
"""

from __future__ import annotations

import time
from typing import Any

from pipeline.candidates.llm.base import Completion, LLMError
from pipeline.config import GenerateConfig
from schemas import Message


class HFChatBackend:
    """Samples chat completions from a causal LM and its tokenizer's chat template."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        name: str = "",
        temperature: float = 0.8,
        top_p: float = 0.95,
        max_new_tokens: int = 4096,
        batch_size: int = 4,
        seed: int = 0,
    ):
        if getattr(tokenizer, "chat_template", None) is None:
            raise LLMError(f"tokenizer of {name or type(model).__name__} has no chat_template")
        self.model = model
        self.tokenizer = tokenizer
        self.name = name or getattr(getattr(model, "config", None), "_name_or_path", "") or "local"
        self.temperature = temperature
        self.top_p = top_p
        self.max_new_tokens = max_new_tokens
        self.batch_size = max(1, batch_size)
        self.seed = seed
        if tokenizer.pad_token_id is None:
            # batching needs a pad token; the end-of-sequence token is the usual stand-in
            tokenizer.pad_token = tokenizer.eos_token

    @classmethod
    def from_pretrained(cls, path: str, cfg: GenerateConfig) -> HFChatBackend:
        """Load model and tokenizer from a local folder or the local Hub cache."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        device = _device(cfg.hf_device)
        dtype = {"auto": "auto", "float32": torch.float32, "bfloat16": torch.bfloat16,
                 "float16": torch.float16}.get(cfg.hf_dtype)
        if dtype is None:
            raise LLMError(f"hf_dtype {cfg.hf_dtype!r}: expected auto|float32|bfloat16|float16")
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
        except OSError as exc:
            raise LLMError(f"cannot load local model {path!r}: {str(exc).splitlines()[0]} "
                           "(needs the checkpoint on disk or in the Hub cache)") from None
        model.eval()
        return cls(model, tokenizer, name=path, temperature=cfg.temperature, top_p=cfg.top_p,
                   max_new_tokens=cfg.max_tokens, batch_size=cfg.hf_batch_size, seed=cfg.seed)

    @property
    def generator_name(self) -> str:
        return f"hf:{self.name}"

    def render(self, messages: list[Message]) -> str:
        """The prompt text the chat template makes of `messages`, ready for the answer."""
        return self.tokenizer.apply_chat_template(
            [{"role": m.role, "content": m.content} for m in messages],
            tokenize=False, add_generation_prompt=True)

    def chat(self, prompts: list[list[Message]], n: int = 1) -> list[list[Completion] | LLMError]:
        """`n` samples per prompt, `batch_size` prompts per `generate` call."""
        results: list[list[Completion] | LLMError] = []
        for start in range(0, len(prompts), self.batch_size):
            batch = prompts[start:start + self.batch_size]
            try:
                results.extend(self._generate(batch, n, start))
            except (RuntimeError, ValueError) as exc:  # e.g. out of memory, context too long
                err = LLMError(f"{self.generator_name}: generation failed: "
                               f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
                results.extend(err for _ in batch)
        return results

    def _generate(self, batch: list[list[Message]], n: int, offset: int) -> list[list[Completion]]:
        import torch

        texts = [self.render(m) for m in batch]
        self.tokenizer.padding_side = "left"  # generated tokens must follow each prompt directly
        enc = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        enc = {k: v.to(self.model.device) for k, v in enc.items()}
        sample = self.temperature > 0
        kwargs: dict[str, Any] = {"max_new_tokens": self.max_new_tokens,
                                  "num_return_sequences": n, "do_sample": sample,
                                  "pad_token_id": self.tokenizer.pad_token_id}
        if sample:
            kwargs.update(temperature=self.temperature, top_p=self.top_p)
        torch.manual_seed(self.seed + offset)  # reproducible samples for a fixed batch layout
        start = time.monotonic()
        with torch.no_grad():
            out = self.model.generate(**enc, **kwargs)
        latency = time.monotonic() - start
        prompt_len = enc["input_ids"].shape[1]
        eos = self.tokenizer.eos_token_id
        pad = self.tokenizer.pad_token_id
        results: list[list[Completion]] = []
        for i in range(len(batch)):
            n_prompt = int(enc["attention_mask"][i].sum())
            samples = []
            for j in range(n):
                new = out[i * n + j, prompt_len:].tolist()
                finished = eos is not None and eos in new
                if finished:
                    new = new[:new.index(eos)]
                while new and pad is not None and new[-1] == pad and pad != eos:
                    new.pop()
                samples.append(Completion(
                    text=self.tokenizer.decode(new, skip_special_tokens=True),
                    finish_reason="stop" if finished else "length",
                    prompt_tokens=n_prompt, completion_tokens=len(new) + int(finished),
                    latency_s=latency / (len(batch) * n)))
            results.append(samples)
        return results


def _device(requested: str) -> str:
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "musa":
        try:
            import torch_musa  # noqa: F401  (registers the musa device)
        except ImportError:
            raise LLMError("hf_device musa needs torch_musa installed") from None
    return requested
