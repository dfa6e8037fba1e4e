"""Run untrusted Python in a child process with limits (stdlib only).

Each run gets a fresh temp working directory, a scrubbed environment (no tokens), rlimits
(address space, CPU time, file size, open files), its own process group (killed whole on timeout),
a network namespace where `unshare -n` works, and stdout/stderr captured to size-capped files.
The child reports its result by writing JSON to `result.json` in its working directory.

Fork bombs: RLIMIT_NPROC does nothing for root (the kernel exempts it), and a child can leave its
process group with setsid. Where a cgroup `pids` hierarchy is writable, each run gets its own
cgroup with `pids.max`, and every process left in it is killed when the run ends, however it
daemonized. Elsewhere RLIMIT_NPROC applies (effective for non-root users) and the process group
is killed. On cgroup v2 that cgroup is also the judge's cpu meter where it has one
(`run_cgroup`, `verifier.isolation.cpu_meter`): a process is in one v2 cgroup only.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from verifier.isolation.cgroups import (
    is_v2_cgroup,
    join_cgroup,
    join_meter,
    kill_cgroup,
    make_pids_cgroup,
)
from verifier.isolation.cpu_bound import bind_cpus
from verifier.isolation.started import REACHED, STARTED_FD_ENV, reached, started_pipe

# Variables a child may inherit; everything else (tokens, credentials, proxies) is dropped.
_ENV_KEEP = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "CUDA_HOME", "CUDA_PATH",
             "CUDA_VISIBLE_DEVICES", "MUSA_HOME", "MUSA_VISIBLE_DEVICES", "LD_LIBRARY_PATH",
             "TORCH_CUDA_ARCH_LIST", "PYTHONPATH", "CC", "CXX", "NVCC_PREPEND_FLAGS",
             "VIRTUAL_ENV")

OUTPUT_CAP_BYTES = 256 * 1024


@dataclass
class SandboxLimits:
    timeout_s: float = 60.0
    memory_mb: int = 8192  # address-space limit; 0 disables (CUDA maps huge virtual ranges)
    cpu_s: int = 0  # 0: derived from the timeout
    file_mb: int = 64
    open_files: int = 1024
    isolate_network: bool = True
    processes: int = 512  # tasks (processes + threads) in the run's pids cgroup / RLIMIT_NPROC
    isolate: bool = True  # namespaces, private /tmp, no root (verifier.isolation.isolate; fork server)
    devices: bool = False  # with isolate: a private /dev of the GPU's nodes (the GPU worker)
    disk_mb: int = 0  # with isolate: size of the private /tmp (0: file_mb)
    run_dir_writable: bool = True  # with isolate: False makes /tmp/run read-only (GPU worker)
    cpu_cgroup: str = ""  # the judge meters the run by it (verifier.isolation.cpu_meter); v2: the run cgroup
    cpus: list[int] = field(default_factory=list)  # the run's cpus, a bound (verifier.isolation.cpu_bound)


@dataclass
class SandboxResult:
    returncode: int | None
    timed_out: bool
    wall_s: float
    stdout: str
    stderr: str
    payload: dict | None = None
    signal_name: str | None = None
    extra: dict = field(default_factory=dict)
    # the child wrote its byte on the parent's pipe (`verifier.isolation.started`): it reached
    # the candidate's code, and what it said after is the candidate's to say
    started: bool = False

    @property
    def crashed(self) -> bool:
        return self.payload is None and not self.timed_out

    def describe_failure(self) -> str:
        """One line on why the child gave no result."""
        if self.timed_out:
            return f"timed out after {self.wall_s:.1f}s"
        after = f" {REACHED}" if self.started else ""
        if self.signal_name:
            hint = {"SIGSEGV": "segmentation fault", "SIGABRT": "abort",
                    "SIGKILL": "killed (memory or CPU limit)", "SIGXCPU": "CPU time limit",
                    "SIGXFSZ": "output/file size limit", "SIGBUS": "bus error"}
            return (f"worker died with {self.signal_name} "
                    f"({hint.get(self.signal_name, 'signal')}){after}")
        tail = _last_line(self.stderr) or _last_line(self.stdout)
        return f"worker exited with code {self.returncode}{after}" + (f": {tail}" if tail else "")


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


@functools.cache
def network_namespace_available() -> bool:
    """True when `unshare -rn` can create a user+network namespace here."""
    exe = shutil.which("unshare")
    if not exe:
        return False
    try:
        return subprocess.run([exe, "-rn", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def run_cgroup(limits: SandboxLimits) -> Path | None:
    """The run's own cgroup, for its pids limit and the kill of what it leaves. On cgroup v2 a
    process is in one cgroup only, so a judge's meter group there (`cpu_cgroup`, made by
    `verifier.isolation.cpu_meter` in the same root) is the run's cgroup and takes its pids limit; else
    a fresh pids cgroup (a cgroup v1 meter is in its own cpuacct hierarchy)."""
    meter = Path(limits.cpu_cgroup) if limits.cpu_cgroup else None
    if meter is None or not is_v2_cgroup(meter):
        return make_pids_cgroup(limits.processes) if limits.processes > 0 else None
    if limits.processes > 0:  # no pids controller there: RLIMIT_NPROC and the final kill
        with contextlib.suppress(OSError):
            (meter / "pids.max").write_text(str(limits.processes))
    return meter


def end_run_cgroup(cgroup: Path, limits: SandboxLimits) -> int:
    """Kill what the run left in its cgroup (`run_cgroup`) and remove the group, unless it is
    the judge's meter group: its owner reads it once more and removes it; returns kills."""
    return kill_cgroup(cgroup, remove=str(cgroup) != limits.cpu_cgroup)


def scrubbed_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: os.environ[k] for k in _ENV_KEEP if k in os.environ}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    # the child runs as a user id of its own that no passwd entry names: getpass.getuser()
    # (torch.compile's cache folders, torch.fx's symbolic tracing) reads these first
    env["USER"] = env["LOGNAME"] = "kssandbox"
    env.update(extra or {})
    # CUDA's JIT cache (CUDA_CACHE_PATH) holds machine code under a hash of the PTX it was made
    # from, and a run can write it: a persistent worker's one cache for all its jobs would load
    # an entry one job placed for a sibling's PTX (the driver reads the variable once, at its
    # start, so no per-job folder is possible). The verifier's builds carry the GPU's own code
    # (no JIT): off costs nothing (tests/verifier/test_redteam_round11.py)
    env["CUDA_CACHE_DISABLE"] = "1"
    return env


def apply_limits(limits: SandboxLimits) -> None:
    """rlimits for the calling process (a sandboxed child, before it runs untrusted code)."""
    if limits.processes > 0 and os.geteuid() != 0:
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.processes, limits.processes))
    if limits.memory_mb > 0:
        cap = limits.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    cpu = limits.cpu_s or int(limits.timeout_s * 2 + 5)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
    fsize = limits.file_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    note = bind_cpus(limits.cpus)  # last: its seccomp filter is the child's own from here
    if note:
        os.write(2, f"kernelsynth: {note}\n".encode())


def sandboxed_argv(argv: list[str], limits: SandboxLimits, cgroup: Path | None,
                   mem_cgroup: Path | None = None, data_mb: int = 0) -> list[str]:
    """`argv` behind the sandbox's exec wrapper (and `unshare -rn` where it works).

    Start it with `start_new_session=True` (setsid, done in C). The limits are entered by a
    fresh single-threaded interpreter (`main` below) that then execs `argv`, not by a
    `preexec_fn`: Python code between fork and exec can deadlock when the parent has other
    threads (on an H100 host a GPU worker started from a warm-up thread hung forever while the
    main thread was importing a module: the fork held logging's lock and waited for the import
    lock). `mem_cgroup`, `data_mb`: the host memory bound of `verifier.isolation.membound` (a memory
    cgroup to join, RLIMIT_DATA in MB).
    """
    cmd = list(argv)
    if limits.isolate_network and not limits.isolate and network_namespace_available():
        cmd = [shutil.which("unshare") or "unshare", "-rn", *cmd]
    spec = json.dumps({"limits": asdict(limits), "cgroup": str(cgroup) if cgroup else None,
                       "mem_cgroup": str(mem_cgroup) if mem_cgroup else None,
                       "data_mb": data_mb})
    return [sys.executable, "-S", "-c", _ENTER, spec, *cmd]


# argv[1]: limits and cgroup; argv[2:]: the command. -S and an explicit path: no site packages
# or PYTHONPATH are needed to import this stdlib-only module.
_ENTER = (f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r}); "
          "from verifier.isolation.sandbox import enter_and_exec; enter_and_exec(sys.argv[1:])")


def enter_and_exec(args: list[str]) -> None:
    """In the wrapper: join the run's pids cgroup, set the rlimits, exec the command."""
    spec, cmd = json.loads(args[0]), args[1:]
    join_cgroup(Path(spec["cgroup"]) if spec["cgroup"] else None)
    join_cgroup(Path(spec["mem_cgroup"]) if spec.get("mem_cgroup") else None)
    limits = SandboxLimits(**spec["limits"])
    join_meter(limits.cpu_cgroup)
    if limits.isolate:  # namespaces, private /tmp, no root (as in the fork server's children)
        from verifier.isolation.isolate import isolate, run_uid

        cwd, note = isolate(os.getcwd(), limits.disk_mb or limits.file_mb,
                            limits.isolate_network, run_uid(os.getpid()), devices=limits.devices,
                            run_writable=limits.run_dir_writable)
        os.chdir(cwd)
        if note:
            os.write(2, f"[sandbox] {note}\n".encode())
    apply_limits(limits)
    if spec.get("data_mb"):
        cap = int(spec["data_mb"]) << 20
        resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))
    os.execvp(cmd[0], cmd)


def _read_capped(path: Path) -> str:
    try:
        with open(path, "rb") as fh:
            data = fh.read(OUTPUT_CAP_BYTES)
            more = fh.read(1)
    except OSError:
        return ""
    text = data.decode("utf-8", "replace")
    return text + ("\n[... output truncated ...]" if more else "")


def run_sandboxed(
    argv: list[str],
    *,
    limits: SandboxLimits | None = None,
    input_files: dict[str, str | bytes] | None = None,
    env: dict[str, str] | None = None,
    workdir: str | Path | None = None,
    keep_workdir: bool = False,
) -> SandboxResult:
    """Run `argv` (e.g. [sys.executable, "-m", "x"]) in a sandbox; parse its result.json."""
    limits = limits or SandboxLimits()
    own_dir = workdir is None
    cwd = prepare_workdir(workdir, input_files)
    start = time.monotonic()
    timed_out = False
    cgroup = run_cgroup(limits)
    cmd = sandboxed_argv(list(argv), limits, cgroup)
    killed = 0
    read_fd, write_fd = started_pipe()
    started = False
    try:
        with open(cwd / ".stdout", "wb") as so, open(cwd / ".stderr", "wb") as se:
            try:
                proc = subprocess.Popen(
                    cmd, cwd=cwd, env=scrubbed_env({**(env or {}),
                                                    STARTED_FD_ENV: str(write_fd)}),
                    stdin=subprocess.DEVNULL, stdout=so, stderr=se, start_new_session=True,
                    close_fds=True, pass_fds=(write_fd,))
            finally:  # the child's alone: only it can write the byte
                os.close(write_fd)
            try:
                proc.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                kill_group(proc.pid)
                proc.wait()
    finally:
        started = reached(read_fd)
        if cgroup is not None:
            killed = end_run_cgroup(cgroup, limits)
    result = collect_result(cwd, proc.returncode, timed_out, time.monotonic() - start,
                            {"leftover_killed": killed, "pids_cgroup": cgroup is not None})
    result.started = started
    if own_dir and not keep_workdir:
        shutil.rmtree(cwd, ignore_errors=True)
    return result


def prepare_workdir(workdir: str | Path | None,
                    input_files: dict[str, str | bytes] | None) -> Path:
    """The run's working directory (a fresh temp dir unless given) with its input files."""
    cwd = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="ks-sbx-"))
    cwd.mkdir(parents=True, exist_ok=True)
    for name, content in (input_files or {}).items():
        if isinstance(content, bytes):
            (cwd / name).write_bytes(content)
        else:
            (cwd / name).write_text(content, encoding="utf-8")
    return cwd


def collect_result(cwd: Path, returncode: int | None, timed_out: bool, wall_s: float,
                   extra: dict) -> SandboxResult:
    """What a finished child left in `cwd`: result.json (unless it timed out) and its output."""
    payload = None
    result_path = cwd / "result.json"
    if result_path.is_file() and not timed_out:
        try:
            payload = json.loads(result_path.read_text(encoding="utf-8"))
        except (ValueError, OSError, RecursionError):  # (nested past the parser's depth)
            payload = None
    sig = signal.Signals(-returncode).name if returncode is not None and returncode < 0 else None
    return SandboxResult(returncode, timed_out, wall_s, _read_capped(cwd / ".stdout"),
                         _read_capped(cwd / ".stderr"), payload, sig, extra=extra)


def stop_process(proc: subprocess.Popen, wait_s: float | None = None) -> bool:
    """Kill a worker's whole process group, reap it and close the pipes we hold to it. With
    `wait_s`, give up reaping after that long (a process stuck in a driver call, state D, dies
    only when the call returns); False then."""
    kill_group(proc.pid)
    reaped = True
    try:
        proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        reaped = False
    for fh in (proc.stdin, proc.stdout, proc.stderr):
        # closing stdin flushes it: EPIPE from the dead worker is expected, nothing is lost
        with contextlib.suppress(OSError):
            if fh:
                fh.close()
    return reaped


def kill_group(pid: int) -> None:
    """SIGKILL the process group `pid` leads, or the process alone when it has no group of its
    own (left its session, or already reaped)."""
    try:
        os.killpg(pid, signal.SIGKILL)
        return
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):  # gone already: nothing to kill
            os.kill(pid, signal.SIGKILL)


class Launcher(Protocol):
    """Runs a verifier entry module (`python -m entry` semantics) in a sandboxed child."""

    def run_module(self, entry: str, *, limits: SandboxLimits | None = None,
                   input_files: dict[str, str | bytes] | None = None,
                   env: dict[str, str] | None = None, workdir: str | Path | None = None,
                   keep_workdir: bool = False) -> SandboxResult: ...


class SpawnLauncher:
    """A fresh interpreter per run (`run_sandboxed`); `verifier.run.forkserver` forks instead."""

    def run_module(self, entry: str, *, limits: SandboxLimits | None = None,
                   input_files: dict[str, str | bytes] | None = None,
                   env: dict[str, str] | None = None, workdir: str | Path | None = None,
                   keep_workdir: bool = False) -> SandboxResult:
        root = str(Path(__file__).resolve().parents[2])
        return run_sandboxed([sys.executable, "-m", entry], limits=limits,
                             input_files=input_files, env={"PYTHONPATH": root, **(env or {})},
                             workdir=workdir, keep_workdir=keep_workdir)


def python_argv(module: str, *args: str) -> list[str]:
    """argv to run `python -m module args` with this interpreter."""
    return [sys.executable, "-m", module, *args]


class EnvironmentFailure(RuntimeError):
    """Every item of a stage failed for one reason of the environment (the interpreter or the
    sandbox), not of the items: the run must stop with that reason instead of rejecting all."""


# How a child fails when the interpreter or the sandbox is broken (the interpreter hidden by
# the private /tmp, the verifier or torch not importable, the fork server down), whatever it ran.
MISSING = re.compile(r"No module named '(torch|verifier|pipeline|numpy)[.']")
ENVIRONMENTAL = re.compile(r"FileNotFoundError|PermissionError|\[sandbox\]|fork server|"
                           + MISSING.pattern)
# an exception raised with the candidate's code on the stack (`verifier.judge.failure`): a
# broken interpreter or sandbox fails before that code is loaded, so a PermissionError raised
# there is the candidate's own (tests/verifier/test_redteam_round11.py)
CANDIDATE_CODE = re.compile(r"candidate\.py line \d+: ")


def common_failure(reasons: list[str], least: int = 3) -> str | None:
    """The one environmental reason (`ENVIRONMENTAL`) shared by all of at least `least`
    failures of runs that never reached the candidate's code (`REACHED`), else None: no item's
    own fault gives every item that same message."""
    if len(reasons) < least or not all(reasons) or any(REACHED in r for r in reasons):
        return None  # a run that reached the candidate's code: what it said may be its own
    if any(CANDIDATE_CODE.search(r) and not MISSING.search(r) for r in reasons):
        return None  # its code ran: its own words, unless the install lacks what it imports
    first = reasons[0]
    same = all(r == first for r in reasons)
    return first if same and ENVIRONMENTAL.search(first) else None


def candidates_words(text: str) -> str:
    """`text` (a result a run that reached the candidate's code wrote: its process is the
    candidate's) with the parent's `REACHED` where it would read as the environment's; a
    module the install lacks stays the environment's (`MISSING`), the candidate's own
    traceback its own (`CANDIDATE_CODE`)."""
    if (REACHED in text or not ENVIRONMENTAL.search(text) or MISSING.search(text)
            or CANDIDATE_CODE.search(text)):
        return text
    return f"{text} ({REACHED})"
