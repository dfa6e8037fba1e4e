"""An HTTP reward service over `verify_batch`, for RL frameworks that call a remote reward.

`python -m verifier serve` / `kernelsynth serve-verifier` (stdlib only; torch for the verifier):

    GET  /health      {"status": "ok", "verifier_version", "backend", "in_flight",
                       "max_concurrency"}
    POST /verify      {"items": [{"task_source" (or "reference"), "response" (or "completion"),
                                  "task_id"?, "candidate_id"?, "backend"?}, ...],
                       "timeout_s"?: float}
                  ->  {"rewards": [float, ...], "verdicts": [{candidate_id, status, stage, reward,
                       reward_components, feedback, speedup, runtime_us, error}, ...]}
    POST /get_reward  OpenRLHF's remote reward call: {"query": [prompt + response, ...],
                       "prompts": [prompt, ...], "labels": [task source, ...]}
                  ->  {"rewards": [...], "scores": [...]}

Every request is one batch (one `verify_batch` call). At most `max_concurrency` batches verify at
a time; a request that finds no free slot within its timeout gets 503. A batch not done within its
timeout (the request's `timeout_s`, capped by the server's) answers 504; its sandboxed runs are
bounded by the same timeout, so the slot frees soon after. Bodies over `max_body_bytes` get 413,
bad JSON or fields 400 with the reason, unknown paths 404, other methods 405.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from verifier.backends import BackendUnavailable
from verifier.protocol import VERIFIER_VERSION, VerdictData, VerifyOptions, VerifyRequest

VERDICT_FIELDS = ("candidate_id", "task_id", "status", "stage", "reward", "reward_components",
                  "feedback", "speedup", "runtime_us", "error", "device")


@dataclass
class ServiceLimits:
    """What one service accepts: concurrency, timeouts and sizes."""

    max_concurrency: int = 2  # batches verifying at once
    timeout_s: float = 600.0  # per request (a request may ask for less)
    max_body_bytes: int = 16 << 20
    max_items: int = 1024


class BadRequest(ValueError):
    """A request the service refuses; `status` is the HTTP code, the message the reason."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def parse_items(payload: Any) -> tuple[list[VerifyRequest], float | None]:
    """VerifyRequests from a /verify body, or BadRequest naming the item and the field."""
    if not isinstance(payload, dict) or not isinstance(payload.get("items"), list):
        raise BadRequest(400, 'body must be a JSON object with an "items" list')
    timeout = payload.get("timeout_s")
    if timeout is not None and (not isinstance(timeout, (int, float)) or timeout <= 0):
        raise BadRequest(400, '"timeout_s" must be a positive number')
    reqs = []
    for i, item in enumerate(payload["items"]):
        if not isinstance(item, dict):
            raise BadRequest(400, f"items[{i}]: expected an object")
        source = item.get("task_source", item.get("reference"))
        response = item.get("response", item.get("completion"))
        if not isinstance(source, str) or not source.strip():
            raise BadRequest(400, f'items[{i}]: needs "task_source" (or "reference"), a string')
        if not isinstance(response, str):
            raise BadRequest(400, f'items[{i}]: needs "response" (or "completion"), a string')
        reqs.append(VerifyRequest(str(item.get("candidate_id", i)), str(item.get("task_id", "")),
                                  source, response, str(item.get("backend") or "auto")))
    return reqs, timeout


def parse_openrlhf(payload: Any) -> list[VerifyRequest]:
    """VerifyRequests from OpenRLHF's {"query", "prompts", "labels"} (labels: task sources)."""
    if not isinstance(payload, dict):
        raise BadRequest(400, "body must be a JSON object")
    queries, prompts, labels = (payload.get(k) for k in ("query", "prompts", "labels"))
    if not isinstance(queries, list) or not isinstance(labels, list):
        raise BadRequest(400, '"query" and "labels" must be lists (labels: the task sources; '
                              "OpenRLHF --label_key reference)")
    prompts = prompts if isinstance(prompts, list) else [""] * len(queries)
    if not len(queries) == len(labels) == len(prompts):
        raise BadRequest(400, f"{len(queries)} queries, {len(prompts)} prompts, "
                              f"{len(labels)} labels: one each per sample")
    reqs = []
    for i, (q, p, label) in enumerate(zip(queries, prompts, labels, strict=True)):
        if not (isinstance(q, str) and isinstance(label, str) and label.strip()):
            raise BadRequest(400, f"sample {i}: query and label must be strings (label: the "
                                  "task source)")
        # The query repeats the prompt, whose code block is the reference: answer only.
        response = q[len(p):] if isinstance(p, str) and p and q.startswith(p) else q
        reqs.append(VerifyRequest(str(i), "", label, response, "auto"))
    return reqs


class RewardService:
    """The verifying side of the server: bounded concurrency and per-request timeouts."""

    def __init__(self, options: VerifyOptions, limits: ServiceLimits,
                 verify: Callable[[list[VerifyRequest], VerifyOptions], list[VerdictData]]
                 | None = None):
        self.options, self.limits = options, limits
        self._verify = verify
        self._slots = threading.BoundedSemaphore(limits.max_concurrency)
        self._pool = ThreadPoolExecutor(max_workers=limits.max_concurrency,
                                        thread_name_prefix="verify")
        self._lock = threading.Lock()
        self.in_flight = 0

    def health(self) -> dict[str, Any]:
        return {"status": "ok", "verifier_version": VERIFIER_VERSION,
                "backend": self.options.backend, "in_flight": self.in_flight,
                "max_concurrency": self.limits.max_concurrency}

    def verify(self, reqs: list[VerifyRequest], timeout_s: float | None) -> list[VerdictData]:
        """Verify one batch within the timeout; BadRequest(503/504/...) when it cannot."""
        if len(reqs) > self.limits.max_items:
            raise BadRequest(413, f"{len(reqs)} items; this service takes at most "
                                  f"{self.limits.max_items} per request")
        timeout = min(timeout_s or self.limits.timeout_s, self.limits.timeout_s)
        if not reqs:
            return []
        if not self._slots.acquire(timeout=timeout):
            raise BadRequest(503, f"busy: {self.limits.max_concurrency} batches verifying, no "
                                  f"slot within {timeout:g} s; retry later")
        opts = replace(self.options, run_timeout_s=min(self.options.run_timeout_s, timeout),
                       compile_timeout_s=min(self.options.compile_timeout_s, timeout))
        with self._lock:
            self.in_flight += 1
        try:
            future = self._pool.submit(self._run, reqs, opts)
        except RuntimeError:
            self._release()
            raise BadRequest(503, "the service is shutting down") from None
        try:
            return future.result(timeout=timeout)
        except FutureTimeout:
            raise BadRequest(504, f"verification did not finish within {timeout:g} s "
                                  f"({len(reqs)} items); send smaller batches or a longer "
                                  "timeout_s") from None
        except BackendUnavailable as exc:
            raise BadRequest(503, f"backend unavailable on this server: {exc}") from None

    def _run(self, reqs: list[VerifyRequest], opts: VerifyOptions) -> list[VerdictData]:
        try:
            verify = self._verify
            if verify is None:
                from verifier.api import verify_batch as verify
            return verify(reqs, opts)
        finally:
            self._release()

    def _release(self) -> None:
        with self._lock:
            self.in_flight -= 1
        self._slots.release()

    def close(self, wait: bool = True) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=True)


def _verdict_json(v: VerdictData) -> dict[str, Any]:
    d = v.to_dict()
    return {k: d[k] for k in VERDICT_FIELDS}


class RewardHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: RewardServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        if self.server.verbose:
            sys.stderr.write("reward-server: " + format % args + "\n")

    def _reply(self, status: int, data: dict[str, Any]) -> None:
        body = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if status == 503:
            self.send_header("Retry-After", "5")
        self.end_headers()
        self.wfile.write(body)

    def _read_json(self) -> Any:
        length = self.headers.get("Content-Length")
        if length is None:
            raise BadRequest(411, "Content-Length required")
        try:
            n = int(length)
        except ValueError:
            raise BadRequest(400, f"bad Content-Length {length!r}") from None
        if n > self.server.service.limits.max_body_bytes:
            self.close_connection = True  # the unread body must not be parsed as a request
            raise BadRequest(413, f"body of {n} bytes is over the limit of "
                                  f"{self.server.service.limits.max_body_bytes}")
        raw = self.rfile.read(n)
        try:
            return json.loads(raw)
        except UnicodeDecodeError as exc:
            raise BadRequest(400, f"body is not UTF-8 JSON: {exc}") from None
        except json.JSONDecodeError as exc:
            raise BadRequest(400, f"invalid JSON: {exc.msg} at line {exc.lineno} column "
                                  f"{exc.colno}") from None

    def do_GET(self) -> None:  # noqa: N802
        if self.path.split("?")[0] == "/health":
            return self._reply(200, self.server.service.health())
        self._reply(404 if self.path.split("?")[0] not in ("/verify", "/get_reward") else 405,
                    {"error": f"no GET {self.path}; use GET /health, POST /verify or "
                              "POST /get_reward"})

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.split("?")[0]
        try:
            if path not in ("/verify", "/get_reward"):
                status = 405 if path == "/health" else 404
                raise BadRequest(status, f"no POST {path}; use POST /verify or /get_reward")
            payload = self._read_json()
            if path == "/verify":
                reqs, timeout = parse_items(payload)
            else:
                reqs, timeout = parse_openrlhf(payload), None
            verdicts = self.server.service.verify(reqs, timeout)
        except BadRequest as exc:
            return self._reply(exc.status, {"error": str(exc)})
        rewards = [v.reward for v in verdicts]
        if path == "/get_reward":
            return self._reply(200, {"rewards": rewards, "scores": rewards})
        self._reply(200, {"rewards": rewards, "verdicts": [_verdict_json(v) for v in verdicts]})

    def do_PUT(self) -> None:  # noqa: N802
        self._reply(405, {"error": "use GET /health, POST /verify or POST /get_reward"})

    do_DELETE = do_PUT


class RewardServer(ThreadingHTTPServer):
    """The reward service on (host, port); port 0 picks a free one (see `.url`)."""

    daemon_threads = True

    def __init__(self, host: str, port: int, service: RewardService, verbose: bool = False):
        super().__init__((host, port), RewardHandler)
        self.service, self.verbose = service, verbose
        self.url = f"http://{host}:{self.server_address[1]}"

    def server_close(self) -> None:
        super().server_close()
        self.service.close(wait=True)


def serve(host: str, port: int, options: VerifyOptions, limits: ServiceLimits,
          verbose: bool = True) -> None:
    """Serve until interrupted (the `serve` commands)."""
    server = RewardServer(host, port, RewardService(options, limits), verbose=verbose)
    print(f"kernelsynth reward service on {server.url} (backend {options.backend}, "
          f"{limits.max_concurrency} concurrent batches, timeout {limits.timeout_s:g} s)",
          file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def main(argv: list[str] | None = None) -> int:
    """`python -m verifier serve [options]`: the reward service with the verifier's options."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m verifier serve",
                                 description="HTTP reward service: POST /verify, "
                                             "POST /get_reward (OpenRLHF), GET /health")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8008)
    ap.add_argument("--backend", default="auto", choices=["auto", "cpu", "cuda", "musa"])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--compile-workers", type=int, default=2)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--perf-trials", type=int, default=20)
    ap.add_argument("--run-timeout", type=float, default=60.0, help="seconds per run stage")
    ap.add_argument("--cache-dir", help="build cache (default ~/.cache/kernelsynth/builds)")
    ap.add_argument("--max-concurrency", type=int, default=2, help="batches verifying at once")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per request at most")
    ap.add_argument("--max-body-mb", type=float, default=16.0)
    ap.add_argument("--max-items", type=int, default=1024, help="completions per request")
    a = ap.parse_args(argv)
    if a.max_concurrency < 1 or a.timeout <= 0:
        ap.error("--max-concurrency must be >= 1 and --timeout > 0")
    opts = VerifyOptions(backend=a.backend, workers=a.workers, compile_workers=a.compile_workers,
                         trials=a.trials, perf_trials=a.perf_trials, run_timeout_s=a.run_timeout,
                         build_cache_dir=a.cache_dir)
    limits = ServiceLimits(a.max_concurrency, a.timeout, int(a.max_body_mb * (1 << 20)),
                           a.max_items)
    serve(a.host, a.port, opts, limits)
    return 0
