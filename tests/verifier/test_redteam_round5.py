"""Red-team round 5 on the cpu backend: attacks on the defences added since round 4.

The reward service's header phase, the judge's instruction-pointer sampler (verifier.ip_sampler:
how it classifies objects, whether a run can tell when it is watched, its share threshold) and
the service's request checks. The sampler's attacks run against the sampling clock with a real
worker process speaking the clock's protocol (as tests/verifier/test_ip_sampler.py does), so
they need no compile and take seconds. Each check is independent of the attacker's own report
where it can be: what the worker's calls really ran is logged by the worker to a file the judge
never reads, and held against the judge's verdict. An attack that still gets through is an
`xfail(strict=True)` naming the hole, so that its fix flips it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from verifier.protocol import VerifyOptions, VerifyRequest
from verifier.reward_server import RewardServer, RewardService, ServiceLimits

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parent))
from redteam_observer import TASK  # noqa: E402


# --- reward service: a head sent a byte at a time -------------------------------------------
def _service(limits: ServiceLimits) -> tuple[RewardServer, list[int]]:
    calls: list[int] = []

    def verify(reqs: list[VerifyRequest], opts: VerifyOptions) -> list:
        calls.append(len(reqs))
        return []

    srv = RewardServer("127.0.0.1", 0, RewardService(VerifyOptions(backend="cpu"), limits,
                                                     verify))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, calls


def _dribble(url: str, stop: threading.Event, every_s: float) -> None:
    """A client that sends its request head one byte every `every_s` (each read of the server
    gets its byte well within the read timeout) and never finishes it."""
    host, port = url.rsplit("/", 1)[1].split(":")
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 10_000
    try:
        with socket.create_connection((host, int(port)), timeout=30) as s:
            for byte in head:
                if stop.is_set():
                    return
                s.sendall(bytes([byte]))
                time.sleep(every_s)
    except OSError:  # the server closed it: what a bounded head does
        return


def _health(url: str) -> bytes:
    host, port = url.rsplit("/", 1)[1].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        got = b""
        while chunk := s.recv(1 << 16):
            got += chunk
        return got


def test_heads_sent_a_byte_at_a_time_do_not_hold_the_connections() -> None:
    """Slowloris on the head: the read timeout bounded each recv, not the head, so clients
    that dribble a byte every half read-timeout held every connection slot for as long as
    they liked and the service answered everyone else 503."""
    srv, calls = _service(ServiceLimits(max_concurrency=1, timeout_s=30, read_timeout_s=1.0,
                                        max_connections=3))
    stop = threading.Event()
    clients = [threading.Thread(target=_dribble, args=(srv.url, stop, 0.4), daemon=True)
               for _ in range(3)]
    try:
        for c in clients:
            c.start()
        time.sleep(2.5)  # over twice the read timeout: every dribbled head is overdue
        answer = _health(srv.url)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        assert b'"status": "ok"' in answer and calls == []
    finally:
        stop.set()
        srv.shutdown()
        srv.server_close()


def test_a_task_source_the_verifier_cannot_write_is_a_400() -> None:
    """A lone surrogate (JSON's "\\udcff") in the task source passed the request checks and
    became the candidate's `runtime_error` with reward 0.1 ("verifier error: 'utf-8' codec
    can't encode"): a verifier failure charged to the candidate. Checked before anything runs."""
    from verifier.reward_requests import BadRequest, parse_items

    bad = TASK.replace("import torch\n", "import torch  # \udcff\n", 1)
    body = json.dumps({"items": [{"task_source": bad, "response": "x"}]})
    with pytest.raises(BadRequest) as exc:
        parse_items(json.loads(body))
    assert exc.value.status == 400 and "items[0]" in str(exc.value)
    assert "UTF-8" in str(exc.value)
