"""Parent side of the persistent GPU workers: start, feed, time out and replace them.

One `GpuWorkerProcess` per visible GPU runs `python -m verifier.gpu_worker` pinned with
CUDA_VISIBLE_DEVICES, in its own session, pids cgroup and network namespace (`unshare -rn`
where it works), with a scrubbed environment. Jobs go in on its stdin; progress and results
come back on a private pipe. A worker that exceeds a job's timeout, dies, floods its output or
reports a broken CUDA context is killed and replaced before the next job; only the job in
flight is affected.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verifier.sandbox import (
    SandboxLimits,
    kill_cgroup,
    make_pids_cgroup,
    sandboxed_argv,
    scrubbed_env,
    stop_process,
)

_PKG_ROOT = str(Path(__file__).resolve().parent.parent)
STARTUP_S = 300.0  # import torch, CUDA context, the profiler's first session
FLOOD_BYTES = 16 << 20
EXIT_GRACE_S = 10.0  # from the worker's pipe closing to its exit status being there
# torch.compile baselines compile in the worker itself: inductor's default pool of compile
# subprocesses kept running beside the timed kernels (H100: 100-200 us kernels timed with a
# repeat CV of 7-15% next to it, 1.7% without)
_QUIET_COMPILE = {"TORCHINDUCTOR_COMPILE_THREADS": "1"}


@dataclass
class RunOutcome:
    """What one job's run produced: the worker's result dict, or why there is none."""

    payload: dict[str, Any] | None
    stage: str = "correctness"  # the last stage the worker reported
    timed_out: bool = False
    failure: str = ""  # one line when payload is None
    flood: bool = False
    wall_s: float = 0.0
    outputs: Any = None  # the raw trial outputs (sandboxed runs): the parent judges them itself
    rechecked: bool = False  # whether `outputs` were collected (sandboxed runs only, so far)
    # the parent-clocked timing windows (`verifier.clock`; sandboxed runs only, so far):
    # (windows, protocol error, the windows' last outputs), or None where there was no clock
    clock: Any = None


class GpuWorkerProcess:
    """One persistent worker on one GPU; `run` blocks until the job's result or a failure."""

    def __init__(self, env: dict[str, str], backend: str = "cuda", memory_mb: int = 0,
                 processes: int = 1024) -> None:
        self.env, self.backend = env, backend
        self.limits = SandboxLimits(timeout_s=1e6, memory_mb=memory_mb, cpu_s=10**7,
                                    file_mb=FLOOD_BYTES * 4 >> 20, processes=processes,
                                    isolate=False)  # loads cache paths; see verifier.isolate
        self.proc: subprocess.Popen | None = None
        self.rfd = -1
        self.buf = b""
        self.workdir: Path | None = None
        self.cgroup: Path | None = None
        self.starts = 0
        self.ready: dict[str, Any] | None = None
        self.eof = False

    def start(self) -> bool:
        """Start the worker and wait until it is warm; False (with `ready` None) on failure."""
        self.workdir = Path(tempfile.mkdtemp(prefix="ks-gpu-"))
        rfd, wfd = os.pipe()
        self.cgroup = make_pids_cgroup(self.limits.processes)
        cmd = sandboxed_argv([sys.executable, "-m", "verifier.gpu_worker", str(wfd),
                              self.backend], self.limits, self.cgroup)
        self.log = open(self.workdir / "worker.log", "wb")  # noqa: SIM115 (lives with the worker)
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=self.log, stderr=subprocess.STDOUT,
            env=scrubbed_env({"PYTHONPATH": _PKG_ROOT, **_QUIET_COMPILE, **self.env}),
            pass_fds=(wfd,),
            cwd=self.workdir, start_new_session=True)
        os.close(wfd)
        self.rfd, self.buf, self.eof = rfd, b"", False
        self.starts += 1
        self.ready = self._read(STARTUP_S)
        if self.ready is None or not self.ready.get("ready"):
            self.ready = None
            return False
        return True

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self.ready is not None

    def _read(self, timeout_s: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.rfd], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(self.rfd, 1 << 20)
                if not chunk:
                    self.eof = True
                    return None
                self.buf += chunk
            elif self.proc is None or self.proc.poll() is not None:
                return None
        line, self.buf = self.buf.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            return None

    def log_size(self) -> int:
        try:
            return (self.workdir / "worker.log").stat().st_size if self.workdir else 0
        except OSError:
            return 0

    def run(self, message: dict[str, Any], timeout_s: float) -> RunOutcome:
        """Send one job ({"job", "task_source", "candidate_source"}) and wait for its result."""
        if not self.alive():
            self.stop()
            if not self.start():
                why = self.describe_exit()
                self.stop()
                return RunOutcome(None, failure=f"the GPU worker did not start: {why}")
        start = time.monotonic()  # the job's clock starts once a warm worker has it
        log_before = self.log_size()
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            self.proc.stdin.flush()
        except OSError:
            self.stop()
            return RunOutcome(None, failure="the GPU worker's input pipe broke",
                              wall_s=time.monotonic() - start)
        stage = "correctness"
        deadline = start + timeout_s
        while True:
            msg = self._read(max(0.0, deadline - time.monotonic()))
            if msg is None:
                closed = ""
                if self.eof:  # the pipe closes in exit() a moment before the pid is reapable
                    try:
                        self.proc.wait(timeout=EXIT_GRACE_S)
                    except subprocess.TimeoutExpired:
                        closed = " (it closed its result pipe and did not exit)"
                timed_out = self.proc.poll() is None
                failure = (f"timed out after {timeout_s:.0f}s{closed}" if timed_out
                           else self.describe_exit())
                flood = self.log_size() - log_before >= FLOOD_BYTES
                self.stop()
                return RunOutcome(None, stage, timed_out, failure, flood,
                                  time.monotonic() - start)
            if "progress" in msg:
                stage = msg["progress"]
                continue
            flood = self.log_size() - log_before >= FLOOD_BYTES
            if flood or msg.get("sticky_cuda_error") or msg.get("outcome") == "cheat":
                self.stop()  # the next candidate gets a clean process
            return RunOutcome(msg, msg.get("stage", stage), False, "", flood,
                              time.monotonic() - start)

    def describe_exit(self) -> str:
        rc = self.proc.poll() if self.proc else None
        if rc is not None and rc < 0:
            name = signal.Signals(-rc).name
            text = f"worker died with {name}"
        else:
            text = f"worker exited with code {rc}"
        try:
            tail = (self.workdir / "worker.log").read_bytes()[-2000:].decode("utf-8", "replace")
        except (OSError, TypeError):
            tail = ""
        lines = [ln for ln in tail.strip().splitlines() if ln.strip()]
        return text + (f": {lines[-1][:300]}" if lines else "")

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None
            self.log.close()
        if self.rfd >= 0:
            os.close(self.rfd)
            self.rfd = -1
        if self.cgroup is not None:
            kill_cgroup(self.cgroup)
            self.cgroup = None
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
        self.ready = None
