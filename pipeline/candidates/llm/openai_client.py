"""A client for OpenAI-compatible chat-completions servers (vLLM, SGLang, TGI, OpenAI itself).

Built on the `openai` SDK, which vLLM and SGLang test their servers against: it owns the
per-request timeout, the retries (429, 408/409, 5xx, timeouts and dropped connections, with
exponential backoff and jitter, honouring `Retry-After`) and the error types. This module adds
`n` samples per prompt (servers that return fewer choices are asked again), a bound on
concurrent requests, token usage per sample, and LLMErrors that name the endpoint and the cause.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai

from pipeline.candidates.llm.base import Completion, LLMError
from pipeline.config import GenerateConfig
from schemas import Message


class OpenAIChatClient:
    """Samples chat completions from one model behind an OpenAI-compatible endpoint."""

    def __init__(
        self,
        base_url: str,
        model: str = "",
        *,
        api_key: str | None = None,
        temperature: float = 0.8,
        top_p: float = 0.95,
        max_tokens: int = 4096,
        concurrency: int = 8,
        timeout_s: float = 300.0,
        retries: int = 4,
        seed: int | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.temperature = temperature
        self.top_p = top_p
        self.max_tokens = max_tokens
        self.concurrency = max(1, concurrency)
        self.timeout_s = timeout_s
        self.retries = max(0, retries)
        self.seed = seed
        self._slots = threading.BoundedSemaphore(self.concurrency)
        self._count = threading.Lock()
        self.requests_made = 0  # every HTTP request, retries included; read by tests
        # Local servers take any key; the SDK insists on one, so "EMPTY" (vLLM's convention).
        self._client = openai.OpenAI(
            base_url=self.base_url, api_key=api_key or "EMPTY", timeout=timeout_s,
            max_retries=self.retries,
            http_client=openai.DefaultHttpxClient(event_hooks={"request": [self._counted]}))

    def _counted(self, request: httpx.Request) -> None:
        with self._count:
            self.requests_made += 1

    @classmethod
    def from_config(cls, cfg: GenerateConfig, api_key: str | None = None) -> OpenAIChatClient:
        """A client with the endpoint and sampling settings of `cfg`."""
        return cls(cfg.openai_base_url, cfg.openai_model, api_key=api_key,
                   temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=cfg.max_tokens,
                   concurrency=cfg.concurrency, timeout_s=cfg.request_timeout_s,
                   retries=cfg.retries, seed=cfg.seed)

    @property
    def generator_name(self) -> str:
        return f"llm:{self.model or 'unknown'}"

    def _error(self, path: str, exc: openai.OpenAIError) -> LLMError:
        """The LLMError for a failure the SDK gave up on (after its retries, where it retries)."""
        where = f"{self.base_url}{path}"
        tries = f"failed after {self.retries + 1} attempts: "
        if isinstance(exc, openai.APIStatusError):
            detail = _detail(exc)
            retried = exc.status_code in (408, 409, 429) or exc.status_code >= 500
            return LLMError(f"{where}: {tries if retried else ''}HTTP {exc.status_code}: {detail}")
        if isinstance(exc, openai.APITimeoutError):
            return LLMError(f"{where}: {tries}timed out after {self.timeout_s:g}s")
        if isinstance(exc, openai.APIConnectionError):
            return LLMError(f"{where}: {tries}connection failed: {exc.__cause__ or exc}")
        return LLMError(f"{where}: {type(exc).__name__}: {exc}")

    def resolve_model(self) -> str:
        """The served model's id (the first of `GET /models`) when none was configured."""
        if not self.model:
            try:
                with self._slots:
                    models = [m.id for m in self._client.models.list()]
            except openai.OpenAIError as exc:
                raise self._error("/models", exc) from None
            if not models or not models[0]:
                raise LLMError(f"{self.base_url}/models: the server lists no model")
            self.model = models[0]
        return self.model

    def complete(self, messages: list[Message], n: int = 1) -> list[Completion]:
        """`n` sampled completions of one chat; servers that return fewer choices are re-asked."""
        model = self.resolve_model()
        out: list[Completion] = []
        for _ in range(n):  # bounded: each round yields at least one choice or raises
            want = n - len(out)
            if want <= 0:
                break
            extra: dict[str, Any] = {}
            if self.seed is not None and self.temperature > 0:
                extra["seed"] = self.seed + len(out)
            start = time.monotonic()
            try:
                with self._slots:
                    resp = self._client.chat.completions.create(
                        model=model, n=want, temperature=self.temperature, top_p=self.top_p,
                        max_tokens=self.max_tokens,
                        messages=[{"role": m.role, "content": m.content} for m in messages],
                        **extra)
            except openai.OpenAIError as exc:
                raise self._error("/chat/completions", exc) from None
            got = _completions(resp, time.monotonic() - start)
            if not got:
                raise LLMError(f"{self.base_url}/chat/completions: response has no choices")
            out.extend(got[:want])
        return out

    def chat(self, prompts: list[list[Message]], n: int = 1) -> list[list[Completion] | LLMError]:
        """`n` completions for each prompt, requests running `concurrency` at a time."""
        if not prompts:
            return []
        self.resolve_model()  # once, before the threads start

        def one(messages: list[Message]) -> list[Completion] | LLMError:
            try:
                return self.complete(messages, n)
            except LLMError as exc:
                return exc

        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(prompts))) as pool:
            return list(pool.map(one, prompts))


def _detail(exc: openai.APIStatusError) -> str:
    """The server's error message (OpenAI's {"error": {"message"}} or a plain body), short."""
    body = exc.body
    if isinstance(body, dict):
        body = body.get("message", body)
    return str(body if body is not None else exc.response.text)[:300].strip()


def _completions(resp: Any, latency_s: float) -> list[Completion]:
    usage = resp.usage
    prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
    total_completion = int(getattr(usage, "completion_tokens", 0) or 0)
    choices = sorted(resp.choices or [], key=lambda c: c.index or 0)
    k = max(1, len(choices))
    out = []
    for i, choice in enumerate(choices):
        message = choice.message
        extra = message.model_extra or {}
        reasoning = extra.get("reasoning_content") or extra.get("reasoning") or ""
        # usage covers the whole request: split the completion tokens over its choices
        share = total_completion // k + (1 if i < total_completion % k else 0)
        out.append(Completion(
            text=message.content or "", finish_reason=choice.finish_reason or "",
            prompt_tokens=prompt_tokens, completion_tokens=share, latency_s=latency_s,
            extra={"reasoning_content": reasoning} if reasoning else {},
        ))
    return out
