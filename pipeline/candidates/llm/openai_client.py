"""A client for OpenAI-compatible chat-completions servers (vLLM, SGLang, TGI, OpenAI itself).

Stdlib only (urllib): `POST {base_url}/chat/completions` with `n` samples per request, a limit on
concurrent requests, a per-request timeout, and retries with exponential backoff on 429, 5xx,
timeouts and dropped connections (honouring `Retry-After`). Token usage is returned per sample.
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from pipeline.candidates.llm.base import Completion, LLMError
from pipeline.config import GenerateConfig
from schemas import Message

MAX_RETRY_AFTER_S = 60.0


class _Retryable(Exception):
    """A failure worth another try (rate limit, server error, timeout, dropped connection)."""

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


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
        backoff_s: float = 1.0,
        seed: int | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key
        self.temperature = temperature
        self.top_p = top_p
        self.max_tokens = max_tokens
        self.concurrency = max(1, concurrency)
        self.timeout_s = timeout_s
        self.retries = max(0, retries)
        self.backoff_s = backoff_s
        self.seed = seed
        self._sleep = sleep
        self._slots = threading.BoundedSemaphore(self.concurrency)
        self._rng = random.Random(seed)
        self.requests_made = 0  # including retries; read by benchmarks and tests

    @classmethod
    def from_config(cls, cfg: GenerateConfig, api_key: str | None = None) -> OpenAIChatClient:
        """A client with the endpoint and sampling settings of `cfg`."""
        return cls(cfg.openai_base_url, cfg.openai_model, api_key=api_key,
                   temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=cfg.max_tokens,
                   concurrency=cfg.concurrency, timeout_s=cfg.request_timeout_s,
                   retries=cfg.retries, backoff_s=cfg.retry_backoff_s, seed=cfg.seed)

    @property
    def generator_name(self) -> str:
        return f"llm:{self.model or 'unknown'}"

    # --- HTTP ----------------------------------------------------------------------------------

    def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base_url + path, data=data, headers=headers,
                                     method=method)
        self.requests_made += 1
        try:
            with self._slots, urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:300].decode("utf-8", "replace").strip()
            if exc.code == 429 or exc.code >= 500:
                raise _Retryable(f"HTTP {exc.code}: {detail}",
                                 _retry_after(exc.headers.get("Retry-After"))) from None
            raise LLMError(f"{self.base_url}{path}: HTTP {exc.code}: {detail}") from None
        except TimeoutError as exc:
            raise _Retryable(f"timed out after {self.timeout_s:g}s ({exc})") from None
        except urllib.error.URLError as exc:
            raise _Retryable(f"connection failed: {exc.reason}") from None
        except (ConnectionError, http.client.HTTPException) as exc:
            raise _Retryable(f"connection dropped: {exc!r}") from None
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            raise _Retryable(f"unparsable response body: {raw[:120]!r}") from None

    def _with_retries(self, method: str, path: str, body: dict | None = None) -> dict:
        last = ""
        for attempt in range(self.retries + 1):
            try:
                return self._request(method, path, body)
            except _Retryable as exc:
                last = str(exc)
                if attempt == self.retries:
                    break
                delay = self.backoff_s * (2 ** attempt)
                delay += self._rng.uniform(0, 0.1 * delay)  # jitter: clients do not resync
                if exc.retry_after is not None:
                    delay = max(delay, exc.retry_after)
                self._sleep(delay)
        raise LLMError(f"{self.base_url}{path}: failed after {self.retries + 1} attempts: {last}")

    def resolve_model(self) -> str:
        """The served model's id (the first of `GET /models`) when none was configured."""
        if not self.model:
            listing = self._with_retries("GET", "/models")
            models = [m.get("id", "") for m in listing.get("data", []) if isinstance(m, dict)]
            if not models or not models[0]:
                raise LLMError(f"{self.base_url}/models: the server lists no model")
            self.model = models[0]
        return self.model

    # --- chat ----------------------------------------------------------------------------------

    def complete(self, messages: list[Message], n: int = 1) -> list[Completion]:
        """`n` sampled completions of one chat; servers that return fewer choices are re-asked."""
        model = self.resolve_model()
        out: list[Completion] = []
        for _ in range(n):  # bounded: each round yields at least one choice or raises
            want = n - len(out)
            if want <= 0:
                break
            body = {"model": model, "messages": [{"role": m.role, "content": m.content}
                                                 for m in messages],
                    "n": want, "temperature": self.temperature, "top_p": self.top_p,
                    "max_tokens": self.max_tokens}
            if self.seed is not None and self.temperature > 0:
                body["seed"] = self.seed + len(out)
            start = time.monotonic()
            payload = self._with_retries("POST", "/chat/completions", body)
            got = _parse_choices(payload, time.monotonic() - start)
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


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return min(MAX_RETRY_AFTER_S, max(0.0, float(value)))
    except ValueError:
        return None  # an HTTP date; the exponential backoff applies instead


def _parse_choices(payload: dict, latency_s: float) -> list[Completion]:
    choices = payload.get("choices") or []
    usage = payload.get("usage") or {}
    prompt_tokens = int(usage.get("prompt_tokens") or 0)
    total_completion = int(usage.get("completion_tokens") or 0)
    k = max(1, len(choices))
    out = []
    for i, choice in enumerate(sorted(choices, key=lambda c: c.get("index", 0))):
        message = choice.get("message") or {}
        text = message.get("content") or ""
        reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
        # usage covers the whole request: split the completion tokens over its choices
        share = total_completion // k + (1 if i < total_completion % k else 0)
        out.append(Completion(
            text=text, finish_reason=choice.get("finish_reason") or "",
            prompt_tokens=prompt_tokens, completion_tokens=share, latency_s=latency_s,
            extra={"reasoning_content": reasoning} if reasoning else {},
        ))
    return out
