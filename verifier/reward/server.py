"""An HTTP reward service over `verify_batch`, for RL frameworks that call a remote reward.

`python -m verifier serve` / `kernelsynth serve-verifier` (stdlib only; torch for the verifier):

    GET  /health      {"status": "ok", "verifier_version", "backend", "in_flight",
                       "max_concurrency", "ended_early"}
    POST /verify      {"items": [{"task_source" (or "reference"), "response" (or "completion"),
                                  "task_id"?, "candidate_id"?, "backend"?}, ...],
                       "timeout_s"?: positive number}
                  ->  {"rewards": [float, ...], "verdicts": [{candidate_id, status, stage, reward,
                       reward_components (an object), feedback, speedup, runtime_us, error}, ...]}
    POST /get_reward  OpenRLHF's remote reward call (`--remote_rm_url`): {"query": [prompt +
                       response, ...], "prompts": [prompt, ...], "labels": [task source, ...]}
                  ->  {"rewards": [...], "scores": [...], "extra_logs": {"kernel_correct": [...]}}

Every request is one batch (one `verify_batch` call) in a slot: under the serve commands a warm
verifier process (`verifier.reward.service`, `ServiceLimits.isolate_batches`). At most `max_concurrency` batches verify at a time; a request that
finds no free slot within its timeout gets 503. A batch not done within its timeout (the
request's `timeout_s`, capped by the server's) answers 504 and its process is ended, as is the
batch of a client that disconnects: the slot frees at once. Requests are checked before anything
runs (`verifier.reward.requests`): a task source that is not a KernelBench task file, NaN,
infinite, negative or mistyped numbers, unknown backends are 400 with the reason. Headers and
body must arrive within `read_timeout_s` (else 408), bodies over `max_body_bytes` get 413, at
most `max_connections` connections are served (one more gets 503 and is closed), at most
`PARSE_SLOTS` bodies are parsed at once (JSON of small numbers is ~10x its size), unknown paths
404, other methods 405. Answers are strict JSON (no NaN; `null` where a number is missing).
"""

from __future__ import annotations

import select
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from verifier.protocol import CORRECT_STATUSES, VerifyOptions
from verifier.reward.requests import (
    BadRequest,
    dumps,
    load_json,
    parse_items,
    parse_openrlhf,
    verdict_json,
)
from verifier.reward.service import Abandoned, RewardService, ServiceLimits

__all__ = ["BadRequest", "RewardServer", "RewardService", "ServiceLimits", "main", "parse_items",
           "parse_openrlhf", "serve"]


def openrlhf_answer(rewards: list[float], statuses: list[str]) -> dict[str, Any]:
    """OpenRLHF's answer: `rewards` (read by its remote_rm_fn), `scores`, and `extra_logs`."""
    correct = [1.0 if s in CORRECT_STATUSES else 0.0 for s in statuses]
    return {"rewards": rewards, "scores": rewards, "extra_logs": {"kernel_correct": correct}}


class RewardHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: RewardServer

    def setup(self) -> None:
        # Every read of headers waits at most this long; bodies get a deadline of it in all.
        self.timeout = self.server.service.limits.read_timeout_s
        super().setup()

    def handle_one_request(self) -> None:
        # the read timeout bounds each recv, not the head: a client sending a byte at a time
        # would hold its connection (and one of max_connections) for ever; the head gets the
        # read timeout in all, as a body does
        self._head_due = threading.Timer(self.timeout, self._head_overdue)
        self._head_due.daemon = True
        self._head_due.start()
        try:
            super().handle_one_request()
        finally:
            self._head_due.cancel()

    def parse_request(self) -> bool:
        self._head_due.cancel()  # the head is in (a body has its own deadline)
        return super().parse_request()

    def _head_overdue(self) -> None:
        try:  # the pending read returns nothing: the request ends, the connection closes
            self.connection.shutdown(socket.SHUT_RD)
        except OSError:
            pass

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        if self.server.verbose:
            sys.stderr.write("reward-server: " + format % args + "\n")

    def _reply(self, status: int, data: dict[str, Any]) -> None:
        body = dumps(data)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if status == 503:
            self.send_header("Retry-After", "5")
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _read_body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None:
            raise BadRequest(411, "Content-Length required")
        try:
            n = int(length)
        except ValueError:
            raise BadRequest(400, f"bad Content-Length {length!r}") from None
        limit = self.server.service.limits.max_body_bytes
        if n < 0 or n > limit:
            self.close_connection = True  # the unread body must not be parsed as a request
            raise BadRequest(413 if n > limit else 400,
                             f"body of {n} bytes is over the limit of {limit}" if n > limit
                             else f"bad Content-Length {n}")
        wait = self.server.service.limits.read_timeout_s
        deadline, chunks, left = time.monotonic() + wait, [], n
        try:
            while left:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                self.connection.settimeout(remaining)
                chunk = self.rfile.read1(min(left, 1 << 16))
                if not chunk:
                    self.close_connection = True
                    raise BadRequest(400, f"body ended after {n - left} of {n} bytes")
                chunks.append(chunk)
                left -= len(chunk)
        except TimeoutError:
            self.close_connection = True  # a half-read body leaves the stream unusable
            raise BadRequest(408, f"body not received within {wait:g} s ({n - left} of {n} "
                                  "bytes)") from None
        finally:
            self.connection.settimeout(wait)
        return b"".join(chunks)

    def _client_gone(self) -> bool:
        """Whether the client closed its side (readable with no data) while we verify."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):  # reset or closed: nobody is waiting for the answer
            return True

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
            raw = self._read_body()
            most = self.server.service.limits.max_items
            # a 16 MB body of small numbers parses to ~160 MB of objects in ~1 s: at most
            # PARSE_SLOTS parses at once, not one per connection (64 of them: ~10 GB)
            with self.server.parse_slots:
                payload = load_json(raw)
                del raw
                if path == "/verify":
                    reqs, timeout = parse_items(payload, most)
                else:
                    reqs, timeout = parse_openrlhf(payload, most), None
                del payload
            verdicts = self.server.service.verify(reqs, timeout, self._client_gone)
        except BadRequest as exc:
            return self._reply(exc.status, {"error": str(exc)})
        except Abandoned:
            self.close_connection = True  # nobody to answer; the batch was ended
            return None
        rewards = [v.reward for v in verdicts]
        if path == "/get_reward":
            return self._reply(200, openrlhf_answer(rewards, [v.status for v in verdicts]))
        self._reply(200, {"rewards": rewards, "verdicts": [verdict_json(v) for v in verdicts]})

    def do_PUT(self) -> None:  # noqa: N802
        self._reply(405, {"error": "use GET /health, POST /verify or POST /get_reward"})

    do_DELETE = do_PUT


PARSE_SLOTS = 4
BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        b"Retry-After: 5\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s")


class RewardServer(ThreadingHTTPServer):
    """The reward service on (host, port); port 0 picks a free one (see `.url`).

    At most `limits.max_connections` connections are served at once (one thread each); one more
    is answered 503 at once and closed, so slow or idle clients cannot use up the threads.
    """

    daemon_threads = True
    request_queue_size = 128

    def __init__(self, host: str, port: int, service: RewardService, verbose: bool = False):
        super().__init__((host, port), RewardHandler)
        self.service, self.verbose = service, verbose
        self.url = f"http://{host}:{self.server_address[1]}"
        self._connections = threading.BoundedSemaphore(service.limits.max_connections)
        self._overflow = threading.BoundedSemaphore(16)  # threads answering 503, 1 s each
        self.parse_slots = threading.BoundedSemaphore(PARSE_SLOTS)  # bodies parsed at once

    def process_request(self, request: Any, client_address: Any) -> None:
        if self._connections.acquire(blocking=False):
            try:
                super().process_request(request, client_address)
            except BaseException:
                self._connections.release()
                raise
            return
        if self._overflow.acquire(blocking=False):
            threading.Thread(target=self._answer_busy, args=(request,), daemon=True).start()
        else:  # a flood past both bounds: no thread for it at all
            self.shutdown_request(request)

    def _answer_busy(self, request: socket.socket) -> None:
        """503 to one connection past the bound: read its head (1 s at most) so it sees it."""
        body = dumps({"error": f"busy: {self.service.limits.max_connections} connections "
                               "open; retry later"})
        try:  # 1 s in all, not per read: a head sent a byte at a time must not hold the thread
            deadline, seen = time.monotonic() + 1.0, b""
            while b"\r\n\r\n" not in seen and len(seen) < 1 << 16:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                request.settimeout(left)
                chunk = request.recv(1 << 14)
                if not chunk:
                    break
                seen += chunk
            request.sendall(BUSY % (len(body), body))
        except OSError as exc:  # slow or gone: it gets no answer, only the close
            if self.verbose:
                sys.stderr.write(f"reward-server: busy answer not sent: {exc}\n")
        finally:
            self.shutdown_request(request)
            self._overflow.release()

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._connections.release()

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
    ap.add_argument("--read-timeout", type=float, default=10.0,
                    help="seconds to receive a request's headers, and its body")
    ap.add_argument("--max-connections", type=int, default=64, help="open connections at most")
    a = ap.parse_args(argv)
    if a.max_concurrency < 1 or a.max_connections < 1 or not 0 < a.timeout < float("inf") \
            or not 0 < a.read_timeout < float("inf"):
        ap.error("--max-concurrency and --max-connections must be >= 1, --timeout and "
                 "--read-timeout finite and > 0")
    opts = VerifyOptions(backend=a.backend, workers=a.workers, compile_workers=a.compile_workers,
                         trials=a.trials, perf_trials=a.perf_trials, run_timeout_s=a.run_timeout,
                         build_cache_dir=a.cache_dir)
    limits = ServiceLimits(max_concurrency=a.max_concurrency, timeout_s=a.timeout,
                           max_body_bytes=int(a.max_body_mb * (1 << 20)), max_items=a.max_items,
                           read_timeout_s=a.read_timeout, max_connections=a.max_connections,
                           isolate_batches=True)
    serve(a.host, a.port, opts, limits)
    return 0
