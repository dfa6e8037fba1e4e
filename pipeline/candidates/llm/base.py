"""The chat interface every LLM backend implements, and what one answer carries."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

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
