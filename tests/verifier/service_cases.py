"""A reward service on loopback for the red-team's attacks on its wire (rounds 4 to 6), and raw
HTTP/1.1 exchanges with it: a client that writes what it likes, byte for byte."""

from __future__ import annotations

import socket
import threading

from verifier.protocol import VerifyOptions, VerifyRequest
from verifier.reward.server import RewardServer, RewardService, ServiceLimits


def recording_server(limits: ServiceLimits) -> tuple[RewardServer, list[int]]:
    """A cpu reward server serving in a thread, and the sizes of the batches that reached its
    verify (which verifies nothing): an attack on the wire must leave it empty."""
    calls: list[int] = []

    def verify(reqs: list[VerifyRequest], opts: VerifyOptions) -> list:
        calls.append(len(reqs))
        return []

    srv = RewardServer("127.0.0.1", 0, RewardService(VerifyOptions(backend="cpu"), limits,
                                                     verify))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, calls


def exchange(url: str, request: bytes, timeout_s: float = 30.0) -> bytes:
    """`request` sent whole to the server at `url`, and all it answers until it closes."""
    host, port = url.rsplit("/", 1)[1].split(":")
    with socket.create_connection((host, int(port)), timeout=timeout_s) as s:
        s.sendall(request)
        got = b""
        while chunk := s.recv(1 << 16):
            got += chunk
        return got


def get_health(url: str) -> bytes:
    """The server's whole answer to GET /health."""
    return exchange(url, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                    timeout_s=10.0)
