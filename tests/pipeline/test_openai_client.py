"""The OpenAI-compatible client against a loopback server that speaks chat completions."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pipeline.config import GenerateConfig
from pipeline.llm import LLMError
from pipeline.llm.openai_client import OpenAIChatClient
from schemas import Message


class FakeServer:
    """Scripted behaviour per request: 'ok', 'ok1' (one choice only), 429, 500, 400, 'slow'."""

    def __init__(self) -> None:
        self.script: list[str] = []
        self.requests: list[dict] = []
        self.auth: list[str | None] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.delay_s = 0.0
        self.client_gone = 0
        self.lock = threading.Lock()


def _handler(state: FakeServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # keep test output clean
            return

        def _send(self, code: int, body: dict, headers: dict | None = None) -> None:
            data = json.dumps(body).encode()
            try:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                state.client_gone += 1  # the client timed out and closed the connection

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": "tiny-coder"}]})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with state.lock:
                state.requests.append(body)
                state.auth.append(self.headers.get("Authorization"))
                action = state.script.pop(0) if state.script else "ok"
                state.in_flight += 1
                state.max_in_flight = max(state.max_in_flight, state.in_flight)
            try:
                time.sleep(state.delay_s)
                if action == "slow":
                    time.sleep(1.0)
                    action = "ok"
                if action == "429":
                    self._send(429, {"error": "rate limited"}, {"Retry-After": "0"})
                elif action == "500":
                    self._send(500, {"error": "boom"})
                elif action == "400":
                    self._send(400, {"error": {"message": "bad request: max_tokens too large"}})
                else:
                    n = 1 if action == "ok1" else body.get("n", 1)
                    last = body["messages"][-1]["content"]
                    choices = [{"index": i, "finish_reason": "stop",
                                "message": {"role": "assistant",
                                            "content": f"answer {i} to: {last}"}}
                               for i in range(n)]
                    self._send(200, {"id": "x", "object": "chat.completion", "choices": choices,
                                     "usage": {"prompt_tokens": 11,
                                               "completion_tokens": 5 * n + 1,
                                               "total_tokens": 11 + 5 * n + 1}})
            finally:
                with state.lock:
                    state.in_flight -= 1

    return Handler


@pytest.fixture
def server() -> Iterator[tuple[FakeServer, str]]:
    state = FakeServer()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    httpd.daemon_threads = True
    httpd.block_on_close = False  # do not wait for the deliberately slow handler
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02},
                              daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    finally:
        httpd.shutdown()
        httpd.server_close()


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


def test_429_then_success_backs_off(server: tuple[FakeServer, str]) -> None:
    state, url = server
    state.script = ["429", "500", "ok"]
    delays: list[float] = []
    client = OpenAIChatClient(url, "m", retries=3, backoff_s=0.5, sleep=delays.append)
    out = client.complete(PROMPT, n=2)
    assert len(out) == 2 and len(state.requests) == 3
    assert len(delays) == 2
    assert 0.5 <= delays[0] <= 0.55 and 1.0 <= delays[1] <= 1.1  # exponential, small jitter


def test_timeout_is_retried_then_succeeds(server: tuple[FakeServer, str]) -> None:
    state, url = server
    state.script = ["slow", "ok"]
    delays: list[float] = []
    client = OpenAIChatClient(url, "m", timeout_s=0.3, retries=2, backoff_s=0.01,
                              sleep=delays.append)
    start = time.monotonic()
    out = client.complete(PROMPT)
    assert out[0].text.startswith("answer 0")
    assert len(delays) == 1 and time.monotonic() - start < 1.0  # did not wait for the slow one


def test_retries_exhausted_and_client_errors_raise(server: tuple[FakeServer, str]) -> None:
    state, url = server
    state.script = ["500", "500", "500"]
    client = OpenAIChatClient(url, "m", retries=2, sleep=lambda s: None)
    with pytest.raises(LLMError, match="failed after 3 attempts: HTTP 500"):
        client.complete(PROMPT)
    state.script = ["400"]
    before = len(state.requests)
    with pytest.raises(LLMError, match="HTTP 400.*max_tokens too large"):
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
    client = OpenAIChatClient("http://127.0.0.1:9/v1", "m", retries=1, timeout_s=1,
                              sleep=lambda s: None)
    with pytest.raises(LLMError, match=r"127\.0\.0\.1:9/v1/chat/completions.*connection"):
        client.complete(PROMPT)
