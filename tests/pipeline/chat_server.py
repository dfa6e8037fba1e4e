"""A loopback server that speaks the OpenAI chat-completions protocol, scripted per request.

Used by the LLM client, generate and repair tests (no network, no model).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def default_reply(body: dict, index: int) -> str:
    return f"answer {index} to: {body['messages'][-1]['content']}"


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
        self.reply: Callable[[dict, int], str] = default_reply
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
                if action == "slow":  # far past a client's timeout, even on a loaded host
                    time.sleep(3.0)
                    action = "ok"
                if action == "429":
                    self._send(429, {"error": "rate limited"}, {"Retry-After": "0"})
                elif action == "500":
                    self._send(500, {"error": "boom"})
                elif action == "400":
                    self._send(400, {"error": {"message": "bad request: max_tokens too large"}})
                else:
                    n = 1 if action == "ok1" else body.get("n", 1)
                    choices = [{"index": i, "finish_reason": "stop",
                                "message": {"role": "assistant",
                                            "content": state.reply(body, i)}}
                               for i in range(n)]
                    self._send(200, {"id": "x", "object": "chat.completion", "choices": choices,
                                     "usage": {"prompt_tokens": 11,
                                               "completion_tokens": 5 * n + 1,
                                               "total_tokens": 11 + 5 * n + 1}})
            finally:
                with state.lock:
                    state.in_flight -= 1

    return Handler


@contextmanager
def chat_server() -> Iterator[tuple[FakeServer, str]]:
    """A running server and its base URL (`.../v1`)."""
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
