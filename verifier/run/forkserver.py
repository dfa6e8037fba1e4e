"""A fork server for sandboxed runs: torch is imported once, each run is a fresh forked child.

`run_sandboxed` starts a new interpreter per run, which spends 1.5-3 s importing torch before
the candidate's first line (6 s on a loaded 2-core host). The server (`python -m
verifier.run.forkserver`) imports torch and the verifier's entry modules once, then forks one child
per request. Each child gets exactly the sandbox of `run_sandboxed`: its own session and
process group, the run's pids cgroup, rlimits, a network namespace (`unshare(CLONE_NEWNET)`, or
a user namespace with it when not root), a scrubbed environment, stdin from /dev/null and
stdout/stderr into size-capped files of its working directory, and none of the server's file
descriptors. It runs the entry module as `__main__` (e.g. `verifier.run.worker`) and reports through
`result.json`, as a spawned child would, so `SandboxResult` is the same for both launchers.

The server never touches a device: CUDA cannot be initialized in a child forked from a process
that did (and `torch.cuda.is_available()` without NVML poisons later forks), so the server
runs with PYTORCH_NVML_BASED_CUDA_CHECK=1 and checks at start that a forked child is not "in a
bad fork"; when it is, `cuda_fork_safe` is False and device runs must be spawned instead.

Protocol (one JSON object per line): the server prints {"ready": ...} once, then answers each
request {"id", "entry", "workdir", "limits", "env", "cgroup"} with {"id", "returncode",
"timed_out", "wall_s", "started"} when the child exits or its timeout kills it ("started": the
child's byte on the server's pipe, `verifier.isolation.started`).
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
import warnings
from concurrent.futures import Future
from dataclasses import asdict
from pathlib import Path
from typing import Any

from verifier.isolation.cgroups import join_cgroup, join_meter
from verifier.isolation.isolate import isolate, run_uid
from verifier.isolation.linux import PR_SET_PDEATHSIG, libc, unshare_network
from verifier.isolation.sandbox import (
    SandboxLimits,
    SandboxResult,
    apply_limits,
    collect_result,
    end_run_cgroup,
    kill_group,
    prepare_workdir,
    run_cgroup,
    scrubbed_env,
)
from verifier.isolation.started import STARTED_FD_ENV, reached, started_pipe

_PKG_ROOT = str(Path(__file__).resolve().parents[2])
# Entry modules the server imports ahead (their module-level imports are stdlib only).
DEFAULT_PRELOAD = ("verifier.run.worker", "verifier.run.collect", "verifier.compile.loadcheck")


class ForkServerError(RuntimeError):
    """The fork server could not be started or stopped answering; the message says why."""


# --- server side -------------------------------------------------------------------------------


def _child(req: dict[str, Any], started_fd: int) -> None:
    """In the forked child: enter the sandbox, run the entry module, never return
    (`started_fd`: the write end of the server's pipe, `verifier.isolation.started`)."""
    code = 1
    try:
        os.setsid()
        join_cgroup(Path(req["cgroup"]) if req.get("cgroup") else None)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the server's death ends the run
        limits = SandboxLimits(**req["limits"])
        join_meter(limits.cpu_cgroup)  # the judge's cpu meter
        workdir, note = req["workdir"], "isolation off"
        if limits.isolate:  # namespaces, private /tmp, hidden home, no root (verifier.isolation.isolate)
            workdir, note = isolate(workdir, limits.file_mb, limits.isolate_network,
                                    run_uid(os.getpid()))
        os.chdir(workdir)
        null = os.open(os.devnull, os.O_RDONLY)
        out = os.open(".stdout", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        err = os.open(".stderr", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        for fd, target in ((null, 0), (out, 1), (err, 2), (started_fd, 3)):
            os.dup2(fd, target)
            if fd != target:
                os.close(fd)
        os.closerange(4, 1 << 16)  # the server's pipes: a candidate must not answer for it
        apply_limits(limits)
        if note:
            os.write(2, f"[sandbox] {note}\n".encode())
        if not limits.isolate and limits.isolate_network and not unshare_network():
            os.write(2, b"[forkserver] no network namespace could be created\n")
        os.environ.clear()
        os.environ.update({**req["env"], STARTED_FD_ENV: "3"})
        sys.argv = [req["entry"]]
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        import runpy

        runpy.run_module(req["entry"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # the entry's own failure: on its stderr, as a spawned child would
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


class _Running:
    def __init__(self, req: dict[str, Any], pid: int, pidfd: int | None, started: int) -> None:
        self.req, self.pid, self.pidfd, self.started = req, pid, pidfd, started
        self.start = time.monotonic()
        self.deadline = self.start + float(req["limits"].get("timeout_s", 60.0))


def _fork_poisoned() -> bool:
    """True when a child forked now could not initialize CUDA (torch's bad-fork flag)."""
    import torch

    pid = os.fork()
    if pid == 0:
        os._exit(3 if torch.cuda._is_in_bad_fork() else 0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 3


def serve(preload: list[str]) -> int:
    """The server loop: fork a sandboxed child per request line on stdin, answer on stdout."""
    warnings.filterwarnings("ignore", category=DeprecationWarning)  # fork() with threads
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    import importlib

    import torch

    poisoned_by = "import torch" if _fork_poisoned() else None
    for name in preload:
        importlib.import_module(name)
        if poisoned_by is None and _fork_poisoned():
            poisoned_by = f"import {name}"
    poisoned = poisoned_by is not None
    if not torch.cuda.is_available():  # a child's first profiler session would cost seconds:
        # the worker traces every call with torch's profiler (`verifier.judge.op_trace.OpNames`)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
            torch.zeros(1).add_(1)

    def send(obj: dict[str, Any]) -> None:
        data = (json.dumps(obj) + "\n").encode()
        while data:
            data = data[os.write(1, data):]

    send({"ready": True, "pid": os.getpid(), "torch": torch.__version__,
          "preloaded": preload, "cuda_fork_safe": not poisoned, "poisoned_by": poisoned_by})
    sel = selectors.DefaultSelector()
    sel.register(0, selectors.EVENT_READ, None)
    running: dict[int, _Running] = {}
    buf = b""
    eof = False
    while not eof or running:
        wait = min((r.deadline for r in running.values()), default=None)
        timeout = None if wait is None else max(0.0, wait - time.monotonic())
        if any(r.pidfd is None for r in running.values()):
            timeout = 0.02 if timeout is None else min(timeout, 0.02)
        for key, _ in sel.select(timeout):
            if key.data is None:
                chunk = os.read(0, 1 << 16)
                if not chunk:
                    eof = True
                    sel.unregister(0)
                    for r in running.values():  # the client is gone: end its runs
                        kill_group(r.pid)
                    continue
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        _start(json.loads(line), running, sel)
        now = time.monotonic()
        for pid, r in list(running.items()):
            timed_out = now >= r.deadline
            if timed_out:
                kill_group(pid)
                done, status = os.waitpid(pid, 0)
            else:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done == 0:
                    continue
            del running[pid]
            if r.pidfd is not None:
                sel.unregister(r.pidfd)
                os.close(r.pidfd)
            send({"id": r.req["id"], "returncode": os.waitstatus_to_exitcode(status),
                  "timed_out": timed_out, "wall_s": time.monotonic() - r.start,
                  "started": reached(r.started)})
    return 0


def _start(req: dict[str, Any], running: dict[int, _Running], sel: selectors.BaseSelector
           ) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    read_fd, write_fd = started_pipe()
    pid = os.fork()
    if pid == 0:
        _child(req, write_fd)
    os.close(write_fd)
    try:
        pidfd: int | None = os.pidfd_open(pid)
        sel.register(pidfd, selectors.EVENT_READ, pid)
    except (AttributeError, OSError):  # old kernel: poll with waitpid instead
        pidfd = None
    running[pid] = _Running(req, pid, pidfd, read_fd)


# --- client side -------------------------------------------------------------------------------


class ForkServer:
    """Client of one fork server process; `run_module` is thread-safe and blocks per call."""

    def __init__(self, preload: tuple[str, ...] = DEFAULT_PRELOAD,
                 env: dict[str, str] | None = None, startup_timeout_s: float = 300.0) -> None:
        self.preload = preload
        self.env = env or {}
        self.startup_timeout_s = startup_timeout_s
        self.info: dict[str, Any] = {}
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._pending: dict[int, Future] = {}
        self._seq = 0
        self.restarts = -1

    # lifecycle
    def start(self) -> None:
        """Start the server (a no-op while it runs); ForkServerError when it cannot start.
        Concurrent callers wait until the server is ready (or failed)."""
        with self._start_lock:
            self._start()

    def _start(self) -> None:
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                return
            self.restarts += 1
            env = scrubbed_env({"PYTHONPATH": _PKG_ROOT, "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
                                **self.env})
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "verifier.run.forkserver", *self.preload],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                start_new_session=True, close_fds=True)
            proc = self._proc
        line = _readline_with_timeout(proc, self.startup_timeout_s)
        try:
            self.info = json.loads(line) if line else {}
        except ValueError:
            self.info = {}
        if not self.info.get("ready"):
            err = (proc.stderr.read() if proc.poll() is not None and proc.stderr else b"")
            self.close()
            raise ForkServerError("the verifier fork server did not start: "
                                  + (err.decode(errors="replace").strip().splitlines() or
                                     ["no answer"])[-1][:300])
        threading.Thread(target=self._read_loop, args=(proc,), daemon=True).start()
        threading.Thread(target=_drain, args=(proc.stderr,), daemon=True).start()

    def _read_loop(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            fut = self._pending.pop(msg.get("id"), None)
            if fut is not None:
                fut.set_result(msg)
        with self._lock:  # EOF: the server died; every run in flight fails, not hangs
            pending, self._pending = dict(self._pending), {}
        for fut in pending.values():
            fut.set_exception(ForkServerError("the verifier fork server exited"))

    def close(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None:
            return
        # EOF on its stdin ends the server's loop; one that is stuck or whose pipe broke is
        # killed below either way
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            if proc.stdin:
                proc.stdin.close()
            proc.wait(timeout=10)
        kill_group(proc.pid)  # children of runs it could not end
        proc.wait()

    def __enter__(self) -> ForkServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def cuda_fork_safe(self) -> bool:
        return bool(self.info.get("cuda_fork_safe"))

    # runs
    def run_module(self, entry: str, *, limits: SandboxLimits | None = None,
                   input_files: dict[str, str | bytes] | None = None,
                   env: dict[str, str] | None = None, workdir: str | Path | None = None,
                   keep_workdir: bool = False) -> SandboxResult:
        """Run `python -m entry` semantics in a forked sandboxed child; like run_sandboxed."""
        import shutil

        limits = limits or SandboxLimits()
        own_dir = workdir is None
        cwd = prepare_workdir(workdir, input_files)
        cgroup = run_cgroup(limits)  # on cgroup v2 the judge's meter group, where it has one
        start = time.monotonic()
        killed = 0
        try:
            reply = self._request({"entry": entry, "workdir": str(cwd), "limits": asdict(limits),
                                   "env": scrubbed_env({"PYTHONPATH": _PKG_ROOT, **(env or {})}),
                                   "cgroup": str(cgroup) if cgroup else None},
                                  limits.timeout_s + 60.0)
        finally:
            if cgroup is not None:
                killed = end_run_cgroup(cgroup, limits)
        extra = {"leftover_killed": killed, "pids_cgroup": cgroup is not None, "forked": True}
        if reply is None:  # the server died or hung: this run has no exit status
            self.close()
            result = collect_result(cwd, None, False, time.monotonic() - start, extra)
            result.stderr += "\n[forkserver] the verifier's fork server stopped answering"
        else:
            result = collect_result(cwd, reply["returncode"], bool(reply["timed_out"]),
                                    float(reply["wall_s"]), extra)
            result.started = bool(reply.get("started"))
        if own_dir and not keep_workdir:
            shutil.rmtree(cwd, ignore_errors=True)
        return result

    def _request(self, req: dict[str, Any], timeout_s: float) -> dict[str, Any] | None:
        self.start()
        fut: Future = Future()
        with self._lock:
            proc = self._proc
            self._seq += 1
            req["id"] = self._seq
            self._pending[self._seq] = fut
            try:
                assert proc is not None and proc.stdin is not None
                proc.stdin.write((json.dumps(req) + "\n").encode())
                proc.stdin.flush()
            except (OSError, AssertionError):
                self._pending.pop(req["id"], None)
                return None
        try:
            return fut.result(timeout=timeout_s)
        except Exception:  # ForkServerError or a timeout: the caller reports no result
            self._pending.pop(req["id"], None)
            return None


def _readline_with_timeout(proc: subprocess.Popen, timeout_s: float) -> bytes | None:
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if sel.select(min(1.0, deadline - time.monotonic())):
                return proc.stdout.readline() or None
            if proc.poll() is not None:
                return None
        return None
    finally:
        sel.close()


def _drain(stream: Any) -> None:
    """Read and discard the server's stderr so it never blocks on a full pipe."""
    if stream is None:
        return
    for _ in iter(lambda: stream.read(1 << 16), b""):
        pass


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1:]))
