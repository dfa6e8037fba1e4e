"""Host side of the task probe: sandboxed fork-server workers that analyze many modules each.

One worker process per slot imports torch once (about 1.5 s) and forks a child per job, so a
module costs a fork, not an interpreter start. Workers run with the sandbox's limits (scrubbed
environment, rlimits entered by the sandbox's exec wrapper rather than a `preexec_fn`, own
session, no network where `unshare -n` works); a worker that dies or stops answering is killed
and replaced, and the job in flight is reported as failed.
"""

from __future__ import annotations

import json
import queue
import selectors
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from verifier.sandbox import SandboxLimits, sandboxed_argv, scrubbed_env, stop_process

_STARTUP_S = 60.0
_SERVER_CPU_S = 7 * 24 * 3600  # a long-lived fork server; jobs are timed separately


class ProbeWorker:
    """One sandboxed fork-server process; `analyze(job)` blocks until its reply or a timeout."""

    def __init__(self, memory_mb: int = 6144):
        self.memory_mb = memory_mb
        self.proc: subprocess.Popen | None = None
        self.workdir: str | None = None
        self.seq = 0

    def start(self) -> None:
        self.workdir = tempfile.mkdtemp(prefix="ks-probe-")
        # The worker lives for many jobs: no CPU-time cap (each job has its own timeout) and no
        # process cap beyond the host's; memory, file size and core dumps as for any sandbox.
        limits = SandboxLimits(memory_mb=self.memory_mb, cpu_s=_SERVER_CPU_S, processes=0)
        cmd = sandboxed_argv([sys.executable, "-m", "pipeline.tasks.probe"], limits, None)
        root = str(Path(__file__).resolve().parents[2])  # the repository root
        env = scrubbed_env({"PYTHONPATH": root})
        self.proc = subprocess.Popen(
            cmd, cwd=self.workdir, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True,
            text=True, bufsize=1,
        )
        line = self._readline(_STARTUP_S)
        if line is None or not json.loads(line).get("ready"):
            self.close()
            raise RuntimeError("task probe worker did not start (is torch importable?)")

    def _readline(self, timeout: float) -> str | None:
        assert self.proc is not None and self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            if not sel.select(timeout):
                return None
            line = self.proc.stdout.readline()
            return line or None
        finally:
            sel.close()

    def analyze(self, job: dict) -> dict:
        """Send one job; the worker enforces job['timeout_s'], this side a little more."""
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        assert self.proc is not None and self.proc.stdin is not None
        self.seq += 1
        try:
            self.proc.stdin.write(json.dumps({"id": self.seq, "job": job}) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self.close()
            return {"ok": False, "reason": "crash", "detail": "probe worker pipe closed"}
        line = self._readline(float(job.get("timeout_s", 20.0)) + 15.0)
        if line is None:
            self.close()
            return {"ok": False, "reason": "timeout", "detail": "probe worker stopped answering"}
        try:
            return json.loads(line)
        except ValueError:
            self.close()
            return {"ok": False, "reason": "crash", "detail": "probe worker sent garbage"}

    def close(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None


class ProbePool:
    """`workers` fork servers; `map(jobs)` analyzes jobs in parallel, results in job order."""

    def __init__(self, workers: int = 2, memory_mb: int = 6144):
        self.workers = max(1, workers)
        self._idle: queue.Queue[ProbeWorker] = queue.Queue()
        self._all: list[ProbeWorker] = []
        self._lock = threading.Lock()
        self.memory_mb = memory_mb

    def _take(self) -> ProbeWorker:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            with self._lock:
                if len(self._all) < self.workers:
                    w = ProbeWorker(self.memory_mb)
                    self._all.append(w)
                    return w
            return self._idle.get()

    def analyze(self, job: dict) -> dict:
        worker = self._take()
        try:
            start = time.monotonic()
            try:
                res = worker.analyze(job)
            except RuntimeError as exc:
                res = {"ok": False, "reason": "probe_unavailable", "detail": str(exc)}
            res.setdefault("wall_s", time.monotonic() - start)
            return res
        finally:
            self._idle.put(worker)

    def map(self, jobs: Iterable[dict], on_result: Callable[[int, dict], None] | None = None
            ) -> list[dict]:
        jobs = list(jobs)
        results: list[dict] = [{}] * len(jobs)

        def one(i: int) -> None:
            results[i] = self.analyze(jobs[i])
            if on_result:
                on_result(i, results[i])

        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            list(pool.map(one, range(len(jobs))))
        return results

    def close(self) -> None:
        for w in self._all:
            w.close()
        self._all.clear()

    def __enter__(self) -> ProbePool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
