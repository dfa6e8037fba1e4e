"""The OpenAI-compatible client against a loopback server that speaks chat completions."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from pipeline.candidates.llm import LLMError
from pipeline.candidates.llm.openai_client import OpenAIChatClient
from pipeline.config import GenerateConfig
from schemas import Message
from tests.pipeline.chat_server import FakeServer, chat_server


@pytest.fixture
def server() -> Iterator[tuple[FakeServer, str]]:
    with chat_server() as running:
        yield running


PROMPT = [Message("system", "be brief"), Message("user", "write a kernel")]


def test_n_samples_usage_and_request_body(server: tuple[FakeServer, str]) -> None:
    state, url = server
    client = OpenAIChatClient(url, "tiny-coder", api_key="sk-test", temperature=0.7, top_p=0.9,
                              max_tokens=123, seed=5)
    out = client.complete(PROMPT, n=3)
    assert [c.text for c in out] == [f"answer {i} to: write a kernel" for i in range(3)]
    assert all(c.prompt_tokens == 11 and c.finish_reason == "stop" for c in out)
    assert sum(c.completion_tokens for c in out) == 16  # the request's usage, split over choices
    assert out[0].usage()["completion_tokens"] == 6
    (body,) = state.requests
    assert body["model"] == "tiny-coder" and body["n"] == 3 and body["max_tokens"] == 123
    assert body["temperature"] == 0.7 and body["top_p"] == 0.9 and body["seed"] == 5
    assert body["messages"] == [{"role": "system", "content": "be brief"},
                                {"role": "user", "content": "write a kernel"}]
    assert state.auth == ["Bearer sk-test"]


def test_server_returning_fewer_choices_is_asked_again(server: tuple[FakeServer, str]) -> None:
    state, url = server
    state.script = ["ok1", "ok1", "ok1"]
    out = OpenAIChatClient(url, "m").complete(PROMPT, n=3)
    assert len(out) == 3
    assert [r["n"] for r in state.requests] == [3, 2, 1]


def test_429_then_500_are_retried_by_the_sdk(server: tuple[FakeServer, str]) -> None:
    state, url = server
    state.script = ["429", "500", "ok"]
    client = OpenAIChatClient(url, "m", retries=3)
    start = time.monotonic()
    out = client.complete(PROMPT, n=2)
    assert len(out) == 2 and len(state.requests) == 3 and client.requests_made == 3
    assert time.monotonic() - start >= 0.5  # the SDK backed off between tries (0.5 s and up)


def test_timeout_is_retried_then_succeeds(server: tuple[FakeServer, str]) -> None:
    state, url = server
    state.script = ["slow", "ok"]
    client = OpenAIChatClient(url, "m", timeout_s=0.3, retries=2)
    out = client.complete(PROMPT)
    assert out[0].text.startswith("answer 0")
    assert client.requests_made == 2 and len(state.requests) == 2
    client = OpenAIChatClient(url, "m", timeout_s=0.3, retries=0)
    state.script = ["slow"]
    start = time.monotonic()
    with pytest.raises(LLMError, match=r"/chat/completions: failed after 1 attempts: timed out "
                                       r"after 0\.3s"):
        client.complete(PROMPT)
    assert time.monotonic() - start < 2.0  # did not wait for the slow answer (3 s)


def test_retries_exhausted_and_client_errors_raise(server: tuple[FakeServer, str]) -> None:
    state, url = server
    state.script = ["500", "500", "500"]
    client = OpenAIChatClient(url, "m", retries=2)
    with pytest.raises(LLMError, match="failed after 3 attempts: HTTP 500: boom"):
        client.complete(PROMPT)
    state.script = ["400"]
    before = len(state.requests)
    with pytest.raises(LLMError, match="HTTP 400: bad request: max_tokens too large"):
        client.complete(PROMPT)
    assert len(state.requests) == before + 1  # a client error is not retried


def test_chat_limits_concurrency_and_keeps_order(server: tuple[FakeServer, str]) -> None:
    state, url = server
    state.delay_s = 0.05
    state.script = ["ok", "ok", "400"]  # one prompt fails for good; the rest still answer
    client = OpenAIChatClient(url, "m", concurrency=2, retries=0)
    prompts = [[Message("user", f"p{i}")] for i in range(6)]
    results = client.chat(prompts, n=1)
    assert state.max_in_flight <= 2
    errors = [r for r in results if isinstance(r, LLMError)]
    assert len(errors) == 1
    for i, r in enumerate(results):
        if not isinstance(r, LLMError):
            assert r[0].text == f"answer 0 to: p{i}"


def test_model_resolved_from_server_and_config(server: tuple[FakeServer, str]) -> None:
    state, url = server
    cfg = GenerateConfig(openai_base_url=url + "/", openai_model="", samples=2, retries=1)
    client = OpenAIChatClient.from_config(cfg)
    assert client.resolve_model() == "tiny-coder"
    assert client.generator_name == "llm:tiny-coder"
    client.chat([PROMPT], n=1)
    assert state.requests[-1]["model"] == "tiny-coder"


def test_unreachable_server_fails_with_named_endpoint() -> None:
    client = OpenAIChatClient("http://127.0.0.1:9/v1", "m", retries=1, timeout_s=1)
    with pytest.raises(LLMError, match=r"127\.0\.0\.1:9/v1/chat/completions: failed after 2 "
                                       "attempts: connection failed"):
        client.complete(PROMPT)
    assert client.requests_made == 2
