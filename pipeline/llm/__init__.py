"""LLM backends for candidate generation: one chat interface over served and local models."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from pipeline.config import GenerateConfig
from schemas import Message


@dataclass
class Completion:
    """One sampled answer to a chat prompt, with what it cost."""

    text: str
    finish_reason: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    extra: dict = field(default_factory=dict)

    def usage(self) -> dict:
        """Token usage as recorded in `Candidate.meta`."""
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "finish_reason": self.finish_reason, "latency_s": round(self.latency_s, 3)}


class LLMError(RuntimeError):
    """A request failed for good (after retries); the message names the endpoint and cause."""


class ChatBackend(Protocol):
    """Anything that answers chat prompts with `n` samples each (served or local model)."""

    generator_name: str  # e.g. "llm:<model>" or "hf:<model>", stored in Candidate.generator

    def chat(self, prompts: list[list[Message]], n: int = 1) -> list[list[Completion] | LLMError]:
        """Sample `n` completions per prompt; a failed prompt yields its LLMError in place."""
        ...


def make_backend(kind: str, cfg: GenerateConfig, api_key: str | None = None) -> ChatBackend:
    """The chat backend `kind` (openai | hf) configured by `cfg`; LLMError says what is missing."""
    if kind == "openai":
        from pipeline.llm.openai_client import OpenAIChatClient

        return OpenAIChatClient.from_config(cfg, api_key=api_key)
    if kind == "hf":
        if not cfg.hf_model:
            raise LLMError("generate.hf_model is empty: name a local checkpoint folder or a "
                           "Hub id already in the local cache")
        from pipeline.llm.hf_local import HFChatBackend

        return HFChatBackend.from_pretrained(cfg.hf_model, cfg)
    raise LLMError(f"unknown LLM backend {kind!r} (expected openai or hf)")
