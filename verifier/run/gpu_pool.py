"""Parent side of the persistent GPU workers: start, feed, time out and replace them.

One `GpuWorkerProcess` per visible GPU runs `python -m verifier.run.gpu_worker` pinned with
CUDA_VISIBLE_DEVICES, with the least privilege of a sandboxed run (`verifier.isolation.isolate`, pure
Python, no bubblewrap): its own user id, pid, mount, network and IPC namespaces, a read-only
root, a private /tmp with its directory at /tmp/run (read-only to it: everything it writes lands
in the size-limited tmpfs, DISK_MB in all), the home directory hidden, a private /dev holding
only the basic nodes and the GPU's (/dev/nvidia*, bound from the host so the driver works), a
pids cgroup, a host memory bound (`verifier.isolation.membound`: a memory cgroup, else RLIMIT_DATA;
RLIMIT_AS cannot bound a CUDA process), rlimits and a scrubbed environment. It cannot see the
build cache: each job's verified objects are copied into its directory (`ext/<job>/`) and
removed after the job. Jobs go in on its stdin; progress and results come back on a private
unix socket; the judge's arenas (the trials', `verifier.judge.trial_judge`, and the timed
windows', `verifier.judge.window_judge`) go to the worker over that socket before the job, so
nothing of output size comes back; the parent-clocked timing windows (`verifier.judge.clock`)
run over two more pipes the worker inherits. A worker that exceeds a job's timeout, dies, floods its output or
reports a broken CUDA context is killed and replaced before the next job; only the job in
flight is affected. The worker says {"started": nonce} as it takes a job; a line out of that
protocol is tampering; a failure it reports after earlier jobs is made again in a fresh worker.
"""

from __future__ import annotations

import json
import os
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from verifier.compile.builder import ArtefactMismatch, copy_for_worker
from verifier.isolation import sandbox
from verifier.isolation.cgroups import kill_cgroup, make_pids_cgroup
from verifier.isolation.cpu_meter import run_meter, run_runnable
from verifier.isolation.isolate import RUN_DIR
from verifier.isolation.membound import host_memory_bound
from verifier.isolation.sandbox import SandboxLimits, sandboxed_argv, scrubbed_env, stop_process
from verifier.judge.clock import JudgeClock, no_judge
from verifier.judge.clock_serve import FDS_ENV
from verifier.judge.pace import Pace, jits
from verifier.run import outcome
from verifier.run.hang_watch import HangWatch
from verifier.run.outcome import Measured, RunOutcome, run_ended, settle_charged, tampered
from verifier.run.seal import Sealed

_PKG_ROOT = str(Path(__file__).resolve().parents[2])
STARTUP_S = 300.0  # import torch, CUDA context, the profiler's first session
FLOOD_BYTES = 16 << 20
# Everything the worker writes lands in its private tmpfs (its own directory is read-only to
# it): DISK_MB in all. After a job that leaves more than JOB_DISK_MB there (the sandboxed
# path's limit per run, `verifier.run.runners`), the worker is replaced, so every job starts with
# at least JOB_DISK_MB free; a job that writes more gets ENOSPC.
JOB_DISK_MB, DISK_MB = 128, 256  # DISK_MB: twice JOB_DISK_MB
WRITABLE = "/tmp/w"  # the worker's caches and job directories (in the tmpfs) when isolated
_announced: set[str] = set()
EXIT_GRACE_S = 10.0  # from the worker's pipe closing to its exit status being there
MAX_LINE_BYTES = 64 << 20  # a result line's bound (honest ones: KBs); past it, a flood
SETTLE_S = 30.0  # for the worker to collect a job's garbage (its finalizers run) and check
REAP_S = 30.0  # a killed worker not reaped by then is left behind (state D in the GPU driver)
# torch.compile baselines compile in the worker itself: inductor's default pool of compile
# subprocesses beside the timed kernels (H100: 100-200 us kernels' repeat CV 7-15%, 1.7% without).
# LD_BIND_NOW: every GOT entry bound at load, all compared (`verifier.run.relocations`)
WORKER_ENV = {"TORCHINDUCTOR_COMPILE_THREADS": "1", "LD_BIND_NOW": "1"}


class GpuWorkerProcess:
    """One persistent worker on one GPU; `run` blocks until the job's result or a failure."""

    def __init__(self, env: dict[str, str], backend: str = "cuda", memory_mb: int = 0,
                 processes: int = 1024, isolate: bool = True, host_memory_mb: int = 0) -> None:
        """`memory_mb`: RLIMIT_AS (0 on CUDA, whose driver reserves terabytes of address
        space); `host_memory_mb`: the worker's host memory, bounded by `verifier.isolation.membound`."""
        self.env, self.backend, self.host_memory_mb = env, backend, host_memory_mb
        self.limits = SandboxLimits(timeout_s=1e6, memory_mb=memory_mb, cpu_s=10**7,
                                    file_mb=FLOOD_BYTES * 4 >> 20, processes=processes,
                                    isolate=isolate, devices=isolate, disk_mb=DISK_MB,
                                    run_dir_writable=not isolate)
        self.mem_cgroup: Path | None = None
        self.memory_bound = ""
        self.clock_fds: tuple[int, ...] = ()
        self.clock: JudgeClock | None = None
        self.watch: HangWatch | None = None  # the job in flight's hang deadlines
        self.jobs, self.arena_fd, self.trials_fd = 0, -1, -1
        self.ext_id: tuple[int, int] = (0, 0)
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.buf = b""
        self.workdir: Path | None = None
        self.cgroup: Path | None = None
        self.starts = 0
        self.ready: dict[str, Any] | None = None
        self.eof = False
        self.earlier = 0  # jobs this worker ran before the one in flight (`confirmed`)

    def start(self) -> bool:
        """Start the worker and wait until it is warm; False (with `ready` None) on failure."""
        self.workdir = Path(tempfile.mkdtemp(prefix="ks-gpu-"))
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        wfd = theirs.fileno()
        # the parent-clocked timing windows (`verifier.judge.clock`): worker -> parent, parent -> it
        req_r, req_w = os.pipe()
        go_r, go_w = os.pipe()
        for fd in (req_r, go_w):
            os.set_blocking(fd, False)
        self.cgroup = make_pids_cgroup(self.limits.processes)
        self.mem_cgroup, data_mb, self.memory_bound = host_memory_bound(self.host_memory_mb,
                                                                        self.cgroup)
        if (kind := self.memory_bound.split(" (")[0]) not in _announced:  # said once a process
            _announced.add(kind)
            sys.stderr.write(f"[gpu worker] host memory bound: {self.memory_bound}\n")
        cmd = sandboxed_argv([sys.executable, "-m", "verifier.run.gpu_worker", str(wfd),
                              self.backend], self.limits, self.cgroup, self.mem_cgroup, data_mb)
        self.log = open(self.workdir / "worker.log", "wb")  # noqa: SIM115 (lives with the worker)
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=self.log, stderr=subprocess.STDOUT,
            env=scrubbed_env({"PYTHONPATH": _PKG_ROOT, **WORKER_ENV,
                              **self.private_caches(), **self.env,
                              FDS_ENV: f"{req_w},{go_r}"}),
            pass_fds=(wfd, req_w, go_r),
            cwd=self.workdir, start_new_session=True)
        theirs.close()
        for fd in (req_w, go_r):
            os.close(fd)
        self.clock_fds = (req_r, go_w)
        self.sock, self.buf, self.eof = mine, b"", False
        self.starts, self.earlier = self.starts + 1, 0
        self.ready = self._read(STARTUP_S)
        if self.ready is None or not self.ready.get("ready"):
            self.ready = None
            return False
        self.sealed = Sealed(self.ready)  # what it holds as ready, held here (`seal`)
        # job objects: made after the sandbox took the directory, so it stays the verifier's
        (ext := self.workdir / "ext").mkdir(mode=0o755)
        os.chmod(ext, 0o755)
        self.ext_id = ((st := os.lstat(ext)).st_dev, st.st_ino)
        return True

    @property
    def inner_dir(self) -> str:
        """The worker's directory as the worker sees it."""
        return RUN_DIR if self.limits.isolate else str(self.workdir)

    def private_caches(self) -> dict[str, str]:
        """Caches (inductor, triton, CUDA's JIT) in the worker's own directory: home is hidden."""
        d = WRITABLE if self.limits.isolate else str(self.workdir)
        return {"HOME": d, "KS_WORKER_TMP": d, "KS_JOB_DISK_MB": str(JOB_DISK_MB), "XDG_CACHE_HOME": f"{d}/.cache", "TRITON_CACHE_DIR": f"{d}/.triton",
                "TORCHINDUCTOR_CACHE_DIR": f"{d}/.inductor", "CUDA_CACHE_PATH": f"{d}/.nv"}

    def stage(self, artefacts: list[Any]) -> tuple[dict[str, dict], Path]:
        """Copy a job's verified objects (`verifier.compile.builder.BuildResult`s) into the worker's
        directory; their entries for the job, paths as the worker sees them. Raises
        `verifier.compile.builder.ArtefactMismatch` when a copy does not match its recorded hash."""
        assert self.workdir is not None
        ext = self.workdir / "ext"
        st = os.lstat(ext)  # the worker owns its directory: it may have swapped ext for its own
        if (st.st_dev, st.st_ino) != self.ext_id or st.st_uid != os.geteuid():
            raise ArtefactMismatch("the GPU worker's object directory was replaced")
        self.jobs += 1
        rel = f"ext/{self.jobs}-{secrets.token_hex(6)}"
        dest = self.workdir / rel
        os.mkdir(dest, 0o755)  # fails where something is there already
        os.chmod(dest, 0o755)
        entries = copy_for_worker(artefacts, dest)
        for e in entries.values():
            os.chmod(dest / e["path"], 0o644)
            e["path"] = f"{self.inner_dir}/{rel}/{e['path']}"
        return entries, dest

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self.ready is not None

    def _read(self, timeout_s: float) -> dict[str, Any] | None:
        assert self.sock is not None
        deadline = time.monotonic() + timeout_s
        watch, clock = self.watch, self.clock
        while b"\n" not in self.buf:  # a job's step may end sooner (`verifier.run.hang_watch`)
            left = min(deadline, watch.deadline(clock) if watch else deadline) - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.sock], [], [], min(left, 1.0))
            if ready:
                # a plain read: descriptors a candidate sends on this socket are closed by the
                # kernel, never received (the worker itself sends none)
                try:
                    chunk = self.sock.recv(1 << 20)
                except ConnectionResetError:  # it died with our job's descriptors unread
                    chunk = b""
                if not chunk:
                    self.eof = True
                    return None
                self.buf += chunk
                if len(self.buf) > MAX_LINE_BYTES:  # no newline: the worker's end, not our memory
                    self.eof = True
                    return None
            elif self.proc is None or self.proc.poll() is not None:
                return None
        line, self.buf = self.buf.split(b"\n", 1)
        try:
            msg = json.loads(line)
        except (ValueError, RecursionError):  # nested past the parser's depth: the candidate's
            msg = None
        # not the worker's loop's: a line out of its protocol (`verifier.run.outcome`)
        return msg if isinstance(msg, dict) else {"malformed": line[:80].decode("latin-1")}

    def log_size(self) -> int:
        try:
            return (self.workdir / "worker.log").stat().st_size if self.workdir else 0
        except OSError:
            return 0

    def run(self, message: dict[str, Any], timeout_s: float, judge: Any = None,
            arena_fd: int = -1, trials_fd: int = -1, pace: Pace | None = None,
            check: Callable[[RunOutcome], RunOutcome] | None = None) -> RunOutcome:
        """Send one job ({"job", "task_source", "candidate_source"}) and wait for its result;
        `judge` (with the descriptor of its arena, sent to the worker with the job) times the
        job's windows (`verifier.judge.clock`); `trials_fd`: the trials' arena
        (`verifier.judge.trial_judge`), sent with the job too; `pace`: the reference's, for
        the clock's settled verdicts and the job's hang deadlines (`verifier.judge.pace`);
        `check`: the judge's check of the trials' slots, made before the worker settles
        (`settle`), which runs what the job left to run later."""
        if not self.alive():
            self.stop()
            if not self.start():
                why = self.describe_exit()
                self.stop()
                return RunOutcome(None, failure=f"the GPU worker did not start: {why}")
        start = time.monotonic()  # the job's clock starts once a warm worker has it
        log_before = self.log_size()
        assert self.proc is not None and self.proc.stdin is not None
        deadline = start + timeout_s
        clock = self.clock = (JudgeClock(judge, fds=self.clock_fds, wait_s=timeout_s)
                              if judge is not None else None)
        if clock is not None:  # the reference's pace; the trials the judge times (its spec)
            clock.pace = pace
            clock.trials_due = (message["job"].get("trials_arena") or {}).get("trials")
            clock.watch(run_meter(self.cgroup), runnable=run_runnable(self.cgroup))  # v2 only
        self.watch = HangWatch(pace, start, timeout_s, jits(message.get("candidate_source", "")))
        self.arena_fd, self.trials_fd = arena_fd, trials_fd
        nonce, earlier = message["job"].get("nonce"), self.earlier
        try:
            out = self._exchange(message, start, deadline, timeout_s, log_before, clock)
        finally:
            self.earlier += 1
            if clock is not None:
                clock.stop()
            calls = self.watch.spent()  # for the profile
            self.clock, self.watch, self.arena_fd, self.trials_fd = None, None, -1, -1
        out.spans.update(calls)
        out = self.settle(check(out) if check is not None else out, nonce, earlier)
        return run_ended(out, clock, nonce, earlier)  # the worker's word, the clock's checks

    def settle(self, out: RunOutcome, nonce: Any = None, earlier: int = 0) -> RunOutcome:
        """Ask the worker to let the job go and collect its garbage, then check itself again
        (`verifier.run.gpu_worker._settle`): what its finalizers do is charged to this job, not
        to the next one (tests/verifier/test_redteam_round8.py). One reply and nothing after
        it: another line is tampering (`verifier.run.outcome.tampered`, the worker goes)."""
        if out.payload is None or not self.alive():
            return out
        began = time.monotonic()
        why = self._send(b'{"settle": true}\n', began + SETTLE_S)
        reply = None if why else self._read(SETTLE_S)
        out.wall_s += out.spans.setdefault("settle", time.monotonic() - began)
        odd = outcome.unexpected_line(reply, "settle", nonce) or (
            f"more after the settle reply ({self.buf[:80]!r})"
            if reply is not None and self.buf.strip() else "")
        broken = "" if odd or reply is None else self.sealed.broken(reply, out.payload)
        if odd or broken:  # (a snapshot not as it was ready: rebound in the worker, `seal`)
            self.stop()
            return tampered(out, odd or broken, earlier, nonce, said="" if broken else outcome.PROTOCOL)
        if settle_charged(out, reply, why or f"no reply within {SETTLE_S:g} s"):
            self.stop()
        return out

    def _exchange(self, message: dict[str, Any], start: float, deadline: float,
                  timeout_s: float, log_before: int, clock: JudgeClock | None) -> RunOutcome:
        """One job: the judge's arenas, then the job, then progress until the result."""
        try:
            return self._exchange_with(message, start, deadline, timeout_s, log_before, clock)
        except OSError as exc:  # the socket broke
            self.stop()
            return RunOutcome(None, failure=f"the GPU worker's result socket: {exc}",
                              wall_s=time.monotonic() - start)

    def _exchange_with(self, message: dict[str, Any], start: float, deadline: float,
                       timeout_s: float, log_before: int, clock: JudgeClock | None
                       ) -> RunOutcome:
        assert self.proc is not None and self.sock is not None
        # the worker takes them with the job, in the order the job names: the judge's arenas
        sent = [(name, fd) for name, fd in (("arena", self.arena_fd), ("trials", self.trials_fd))
                if fd >= 0]
        message = {**message, "job": {**message["job"], "fds": [name for name, _ in sent]}}
        if sent:
            socket.send_fds(self.sock, [b"o"], [fd for _, fd in sent])
        else:
            self.sock.sendall(b"o")
        why = self._send((json.dumps(message) + "\n").encode(), deadline)
        if why:
            self.stop()
            return RunOutcome(None, failure=f"the GPU worker {why}", timed_out="took" in why,
                              wall_s=time.monotonic() - start)
        stage, phase, nonce = "correctness", "start", message["job"].get("nonce")
        measured = Measured()  # figures sent as measured: the verdict's (not the result's)
        while True:
            msg = self._read(max(0.0, deadline - time.monotonic()))
            odd = outcome.unexpected_line(msg, phase, nonce) or measured.take(msg)
            if odd:  # not this job's line: the worker goes, the job is not judged by it
                self.stop()
                return tampered(RunOutcome(None, stage, failure=odd,
                                           wall_s=time.monotonic() - start), odd,
                                self.earlier, nonce)
            if msg is not None and phase == "start":
                phase = "job"
                continue
            if msg is None:
                closed = ""
                if self.eof:  # the pipe closes in exit() a moment before the pid is reapable
                    try:
                        self.proc.wait(timeout=EXIT_GRACE_S)
                    except subprocess.TimeoutExpired:
                        closed = " (it closed its result pipe and did not exit)"
                timed_out = self.proc.poll() is None
                hung = self.watch.why(clock) if self.watch and timed_out else ""
                failure = (hung or f"timed out after {timeout_s:.0f}s{closed}" if timed_out
                           else self.describe_exit(reached=phase == "job"))
                flood = self.log_size() - log_before >= FLOOD_BYTES
                self.stop()
                return RunOutcome(None, stage, timed_out, failure, flood, time.monotonic() - start)
            if "measured" in msg:  # kept by `measured` above
                continue
            if "progress" in msg or "step" in msg:  # a step of the job (its hang deadline)
                stage = str(msg.get("progress") or stage)
                if self.watch is not None:
                    self.watch.on(str(msg.get("progress") or msg.get("step")))
                continue
            flood = self.log_size() - log_before >= FLOOD_BYTES
            msg["error"] = sandbox.candidates_words(str(msg["error"])) if msg.get("error") else None
            # the worker is pid 1 of its own namespace: name it by the host's pid; its device
            msg["worker_ns_pid"], msg["worker_pid"] = msg.get("worker_pid"), self.proc.pid
            msg["device"] = (self.ready or {}).get("device")  # as ready, before any candidate
            if flood or msg.get("sticky_cuda_error") or msg.get("outcome") == "cheat" \
                    or msg.get("worker_leaves"):  # (it exits: a job sent now would fail)
                self.stop()  # the next candidate gets a clean process
            timed = None
            if msg.get("outcome") in ("ok", "baseline"):  # (a reference served to the windows)
                timed = clock.result() if clock is not None else no_judge()
            return RunOutcome(msg, msg.get("stage", stage), False, "", flood,
                              time.monotonic() - start, clock=timed,
                              own_share=measured.get("own_share"))

    def _send(self, data: bytes, deadline: float) -> str:
        """Write a job to the worker's stdin without blocking past `deadline` (a worker that
        stopped reading would otherwise hold the verifier once the pipe is full); "" when sent,
        else why not."""
        assert self.proc is not None and self.proc.stdin is not None
        fd = self.proc.stdin.fileno()
        os.set_blocking(fd, False)
        while data:
            if time.monotonic() > deadline:
                return "took no job input within the run's timeout"
            _, ready, _ = select.select([], [fd], [], 1.0)
            if not ready:
                if self.proc.poll() is not None:
                    return "exited before taking the job"
                continue
            try:
                data = data[os.write(fd, data):]
            except BlockingIOError:
                continue
            except OSError:
                return "input pipe broke"
        return ""

    def describe_exit(self, reached: bool = False) -> str:
        """How the worker ended; `reached`: its log was the candidate's to write (after start)."""
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
        return (sandbox.candidates_words if reached else str)(text + (f": {lines[-1][:300]}"
                                                                        if lines else ""))

    def stop(self) -> None:
        if self.proc is not None:
            if not stop_process(self.proc, REAP_S):
                sys.stderr.write(f"[gpu worker] pid {self.proc.pid} not reaped {REAP_S:g} s "
                                 "after SIGKILL (stuck in the driver?); a fresh one is started\n")
            self.proc = None
            self.log.close()
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.clock is not None:  # its thread reads the pipe closed here
            self.clock.stop()
        for fd in self.clock_fds:
            os.close(fd)
        self.clock_fds = ()
        for cg in (self.cgroup, self.mem_cgroup):
            if cg is not None:
                kill_cgroup(cg)
        self.cgroup = self.mem_cgroup = None
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
        self.ready = None
