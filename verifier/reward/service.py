"""The verifying side of the reward service: slots, each a warm verifier process that can be ended.

A slot is a child process that imported the verifier once and runs one `verify_batch` at a time.
A batch that runs past its timeout, or whose client went away, is ended by killing the child's
process group (its forked runs die with it: they hold PR_SET_PDEATHSIG or sit in the group;
run cgroups left behind are reaped by the next batch), and a fresh child takes the slot. So no
request holds a slot longer than its own timeout or its client's patience.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, replace
from queue import Empty, Queue
from typing import Any

from verifier.backends import BackendUnavailable
from verifier.protocol import VERIFIER_VERSION, VerdictData, VerifyOptions, VerifyRequest
from verifier.reward.requests import BadRequest

Verify = Callable[[list[VerifyRequest], VerifyOptions], list[VerdictData]]
POLL_S = 0.2  # how often a waiting request looks at its client and its batch


@dataclass
class ServiceLimits:
    """What one service accepts: concurrency, timeouts, sizes and open connections."""

    max_concurrency: int = 2  # batches verifying at once
    timeout_s: float = 600.0  # per request (a request may ask for less)
    max_body_bytes: int = 16 << 20
    max_items: int = 1024
    read_timeout_s: float = 10.0  # to receive a request's headers, and its body, in full
    max_connections: int = 64  # open client connections (one thread each)
    # True (the serve commands): each slot is a warm verifier process, ended when its request
    # times out or its client goes away. False (embedding; tests that patch the verifier in
    # this process): batches run on threads here and hold their slot until they finish.
    isolate_batches: bool = False


class BatchFailed(BadRequest):
    """The slot's child answered with an error (its process is fine and stays warm)."""


class Abandoned(Exception):
    """The client closed its connection while its batch was verifying."""


def _batch_loop(conn: Any) -> None:
    """A slot's child: verify each batch received on `conn`, answer (kind, value)."""
    os.setsid()  # its own process group, so ending it ends every run it started
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the pipe's EOF still ends the loop
        pass
    from verifier.api import verify_batch

    while True:
        try:
            reqs, opts = conn.recv()
        except (EOFError, OSError):
            return
        try:
            conn.send(("ok", verify_batch(reqs, opts)))
        except BackendUnavailable as exc:
            conn.send(("unavailable", str(exc)))
        except Exception as exc:  # noqa: BLE001 - the parent answers 500 with the reason
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


class BatchProcess:
    """One slot's warm verifier process."""

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")  # the server is threaded: never fork it
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_batch_loop, args=(child,), name="reward-verify")
        self.proc.start()
        child.close()

    def run(self, reqs: list[VerifyRequest], opts: VerifyOptions, deadline: float,
            abandoned: Callable[[], bool]) -> list[VerdictData]:
        """The batch's verdicts; FutureTimeout past `deadline`, Abandoned when the client left."""
        self.conn.send((reqs, opts))
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise FutureTimeout
            if self.conn.poll(min(POLL_S, left)):
                kind, value = self.conn.recv()
                if kind == "ok":
                    return value
                raise BatchFailed(503 if kind == "unavailable" else 500,
                                 f"backend unavailable on this server: {value}"
                                 if kind == "unavailable" else f"verifier failed: {value}")
            if not self.proc.is_alive():
                raise BadRequest(500, f"the verifier process died (exit {self.proc.exitcode})")
            if abandoned():
                raise Abandoned

    def kill(self) -> None:
        """End the child and every process of its group."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            self.proc.kill()  # it had not reached setsid yet, or is gone already
        self.proc.join(timeout=10)
        self.conn.close()


class RewardService:
    """Bounded concurrent batches with per-request timeouts (see ServiceLimits.isolate_batches)."""

    def __init__(self, options: VerifyOptions, limits: ServiceLimits, verify: Verify | None = None):
        self.options, self.limits = options, limits
        self._verify = verify
        self._lock = threading.Lock()
        self.in_flight = 0
        self.ended = 0  # batches ended early (timeout or client gone)
        self._idle: Queue[BatchProcess | None] = Queue()
        self._pool = None
        if verify is None and limits.isolate_batches:
            for _ in range(limits.max_concurrency):
                self._idle.put(BatchProcess())
        else:  # a batch on a thread cannot be ended: it holds its slot until it returns
            self._pool = ThreadPoolExecutor(max_workers=limits.max_concurrency,
                                            thread_name_prefix="verify")
            for _ in range(limits.max_concurrency):
                self._idle.put(None)
        self._closed = False

    def health(self) -> dict[str, Any]:
        return {"status": "ok", "verifier_version": VERIFIER_VERSION,
                "backend": self.options.backend, "in_flight": self.in_flight,
                "max_concurrency": self.limits.max_concurrency, "ended_early": self.ended}

    def verify(self, reqs: list[VerifyRequest], timeout_s: float | None,
               abandoned: Callable[[], bool] = lambda: False) -> list[VerdictData]:
        """Verify one batch within the timeout; BadRequest(503/504/...) when it cannot."""
        if len(reqs) > self.limits.max_items:
            raise BadRequest(413, f"{len(reqs)} items; this service takes at most "
                                  f"{self.limits.max_items} per request")
        timeout = min(timeout_s or self.limits.timeout_s, self.limits.timeout_s)
        if not reqs:
            return []
        deadline = time.monotonic() + timeout
        slot = self._take_slot(deadline, abandoned)
        opts = replace(self.options, run_timeout_s=min(self.options.run_timeout_s, timeout),
                       compile_timeout_s=min(self.options.compile_timeout_s, timeout))
        with self._lock:
            self.in_flight += 1
        if slot is None:
            return self._run_in_thread(reqs, opts, timeout)
        try:
            return slot.run(reqs, opts, deadline, abandoned)
        except BatchFailed:
            raise
        except BaseException as exc:
            # The child may be mid-batch: end it, and a fresh one takes the slot.
            slot.kill()
            slot = None if self._closed else BatchProcess()
            if isinstance(exc, (FutureTimeout, Abandoned)):
                with self._lock:
                    self.ended += 1
            if isinstance(exc, FutureTimeout):
                raise BadRequest(504, f"verification did not finish within {timeout:g} s "
                                      f"({len(reqs)} items); send smaller batches or a longer "
                                      "timeout_s") from None
            raise
        finally:
            with self._lock:
                self.in_flight -= 1
            if slot is not None:
                self._idle.put(slot)

    def _take_slot(self, deadline: float, abandoned: Callable[[], bool]) -> BatchProcess | None:
        while True:
            left = deadline - time.monotonic()
            try:
                return self._idle.get(timeout=max(0.0, min(POLL_S, left)))
            except Empty:
                if left <= POLL_S:
                    raise BadRequest(503, f"busy: {self.limits.max_concurrency} batches "
                                          "verifying, no slot within the request's timeout; "
                                          "retry later") from None
                if abandoned():
                    raise Abandoned from None

    def _run_in_thread(self, reqs: list[VerifyRequest], opts: VerifyOptions,
                       timeout: float) -> list[VerdictData]:
        assert self._pool is not None
        verify = self._verify
        if verify is None:
            from verifier.api import verify_batch as verify

        def run() -> list[VerdictData]:
            try:
                return verify(reqs, opts)
            finally:  # a thread cannot be ended: its slot frees when it returns
                with self._lock:
                    self.in_flight -= 1
                self._idle.put(None)

        try:
            future = self._pool.submit(run)
        except RuntimeError:
            with self._lock:
                self.in_flight -= 1
            self._idle.put(None)
            raise BadRequest(503, "the service is shutting down") from None
        try:
            return future.result(timeout=timeout)
        except BackendUnavailable as exc:
            raise BadRequest(503, f"backend unavailable on this server: {exc}") from None
        except FutureTimeout:
            raise BadRequest(504, f"verification did not finish within {timeout:g} s "
                                  f"({len(reqs)} items)") from None

    def close(self, wait: bool = True) -> None:
        """End every slot's process (and the thread pool of an injected verify)."""
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=wait, cancel_futures=True)
        while True:
            try:
                slot = self._idle.get_nowait()
            except Empty:
                return
            if slot is not None:
                slot.kill()
