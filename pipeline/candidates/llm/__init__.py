"""LLM backends for candidate generation: one chat interface over served and local models."""

from __future__ import annotations

from pipeline.candidates.llm.base import ChatBackend, Completion, LLMError
from pipeline.config import GenerateConfig

__all__ = ["ChatBackend", "Completion", "LLMError", "make_backend"]


def make_backend(kind: str, cfg: GenerateConfig, api_key: str | None = None) -> ChatBackend:
    """The chat backend `kind` (openai | hf) configured by `cfg`; LLMError says what is missing."""
    if kind == "openai":
        from pipeline.candidates.llm.openai_client import OpenAIChatClient

        return OpenAIChatClient.from_config(cfg, api_key=api_key)
    if kind == "hf":
        if not cfg.hf_model:
            raise LLMError("generate.hf_model is empty: name a local checkpoint folder or a "
                           "Hub id already in the local cache")
        from pipeline.candidates.llm.hf_local import HFChatBackend

        return HFChatBackend.from_pretrained(cfg.hf_model, cfg)
    raise LLMError(f"unknown LLM backend {kind!r} (expected openai or hf)")
