"""Least privilege for a sandboxed child: namespaces, a private view of the file system, no root.

`isolate(workdir, tmp_mb, network)` is called by a freshly forked, single-threaded child before it runs
untrusted code. It enters new mount, pid, IPC and (unless `network` is False) network namespaces (plus a user namespace when
not root), forks once so the rest runs as pid 1 of the new pid namespace (when it exits, the
kernel kills every descendant, daemons and double forks included; the outer process waits and
exits with its status), mounts a fresh /proc, puts size-limited tmpfs over /tmp, /var/tmp and
/dev/shm with the run's directory bound at /tmp/run, hides the home directory of the verifier's
user (build cache, baselines, credentials) except the paths Python itself needs, makes those
read-only, and finally drops to an unprivileged user id of its own (`run_uid`) with no supplementary groups, no
capabilities and `no_new_privs`. It returns a note on what it could not do; callers log it.

Pure Python through ctypes (Python 3.11 has no os.unshare); bubblewrap is not needed.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import signal
import sys
from pathlib import Path

from verifier.isolation.linux import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWUSER,
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_PRIVATE,
    MS_RDONLY,
    MS_REC,
    MS_REMOUNT,
    PR_SET_NO_NEW_PRIVS,
    PR_SET_PDEATHSIG,
    libc,
    mount,
    wait_and_mirror,
)

NOBODY = 65534
# Runs at once get different unprivileged ids (RLIMIT_NPROC counts per user: one run's fork
# bomb must not starve another's threads): RUN_UID_BASE + a slot number.
RUN_UID_BASE, RUN_UID_SLOTS = 200_000, 1 << 16


def run_uid(seq: int) -> int:
    """An unprivileged user id for the run numbered `seq` (no account needed)."""
    return RUN_UID_BASE + seq % RUN_UID_SLOTS
RUN_DIR = "/tmp/run"

def interpreter_dirs() -> list[str]:
    """Directories the interpreter runs from, wherever they live (a virtualenv under /tmp or a
    home): its prefixes, the folders of its executable and of the link's target, and the base
    interpreter's folder that the venv's pyvenv.cfg names (`home = ...`)."""
    exe_dir = os.path.dirname(os.path.abspath(sys.executable))
    dirs = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, exe_dir,
            os.path.dirname(os.path.realpath(sys.executable))]
    # the venv's root from its pyvenv.cfg: under `python -S` (the sandbox's wrappers) site.py
    # never ran, so sys.prefix is the base interpreter's
    for root in (sys.prefix, exe_dir, os.path.dirname(exe_dir)):
        try:
            cfg = Path(root, "pyvenv.cfg").read_text()
        except OSError:  # not a venv
            continue
        dirs.append(root)
        for line in cfg.splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home" and value.strip():
                dirs.append(value.strip())
    out = []
    for d in dirs:
        for p in (os.path.abspath(d), os.path.realpath(d)):
            if p and os.path.isdir(p) and p not in out:
                out.append(p)
    return out


def _home_paths_needed(home: str) -> list[str]:
    """Top-level entries of `home` that Python, torch or the verifier are loaded from."""
    pkg = str(Path(__file__).resolve().parents[2])
    wanted = [*interpreter_dirs(), os.path.realpath(sys.executable), pkg,
              *[p for p in sys.path if p]]
    tops = set()
    for p in wanted:
        real = os.path.realpath(p)
        if real.startswith(home.rstrip("/") + "/"):
            tops.add(os.path.join(home, real[len(home.rstrip("/")) + 1:].split("/")[0]))
    return sorted(tops)


def isolate(workdir: str, tmp_mb: int, network: bool = True, uid: int = NOBODY,
            devices: bool = False, run_writable: bool = True) -> tuple[str, str]:
    """Enter the sandbox; returns (the new working directory, a note on what was not done).
    `devices`: a private /dev holding only `device_plan()`'s nodes (the GPU worker's).
    `run_writable` False: the run's directory is read-only, so everything the process writes
    lands in the size-limited tmpfs (/tmp, /var/tmp, /dev/shm): its total is bounded."""
    root = os.geteuid() == 0
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | (CLONE_NEWNET if network else 0)
    if not root:
        flags |= CLONE_NEWUSER
    # the caller's own ids (for the user namespace's map); `uid` stays the run's user
    outer_uid, outer_gid = os.getuid(), os.getgid()
    # the account's home from the password database, not $HOME (a worker's HOME points into
    # its own directory)
    try:
        home = pwd.getpwuid(os.getuid()).pw_dir if root else ""
    except KeyError:
        home = os.path.expanduser("~") if root else ""
    if libc.unshare(flags) != 0:
        err = ctypes.get_errno()
        return workdir, f"no namespaces ({os.strerror(err)}): running without isolation"
    if not root:
        try:
            Path("/proc/self/setgroups").write_text("deny")
            Path("/proc/self/uid_map").write_text(f"0 {outer_uid} 1")
            Path("/proc/self/gid_map").write_text(f"0 {outer_gid} 1")
        except OSError as exc:
            return workdir, f"user namespace id map failed ({exc})"
    pid = os.fork()
    if pid != 0:
        wait_and_mirror(pid)
    # pid 1 of the new namespace from here on, leader of its own session
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    os.setsid()
    notes = []
    try:
        _private_fs(workdir, tmp_mb, home, notes, devices)
        cwd = RUN_DIR
    except OSError as exc:
        notes.append(f"private file system failed ({exc})")
        cwd = workdir
    if root:
        try:
            for dirpath, dirs, files in os.walk(workdir if cwd == workdir else cwd):
                for name in (*dirs, *files):
                    os.chown(os.path.join(dirpath, name), uid, uid, follow_symlinks=False)
            os.chown(cwd, uid, uid)
        except OSError as exc:  # fail closed: untrusted code never runs as root
            raise PermissionError(f"[sandbox] could not drop root to uid {uid}: {exc}") from exc
    if not run_writable:  # fail closed (an exception): the disk total must hold
        if cwd != RUN_DIR:
            raise PermissionError("[sandbox] no private file system: the run's directory "
                                  "cannot be made read-only")
        mount(None, RUN_DIR, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    if root:
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        except OSError as exc:  # fail closed: untrusted code never runs as root
            raise PermissionError(f"[sandbox] could not drop root to uid {uid}: {exc}") from exc
        if os.getresuid() != (uid, uid, uid) or os.getresgid() != (uid, uid, uid):
            raise PermissionError(f"[sandbox] still uid {os.getresuid()} after dropping root")
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # cleared by the uid change
    return cwd, "; ".join(notes)


def _private_fs(workdir: str, tmp_mb: int, home: str, notes: list[str],
                devices: bool = False) -> None:
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    dev_fds = {}
    if devices:  # opened before anything is mounted over them
        plan = device_plan()
        dev_fds = {t: os.open(src, os.O_PATH) for kind, t, src in plan if kind == "bind"}
    keep = {p: os.open(p, os.O_PATH) for p in _home_paths_needed(home)} if home else {}
    # the interpreter (a virtualenv under /tmp) and import paths under /tmp (a test's entry
    # module) stay visible, read-only
    tmp_paths = {os.path.realpath(p) for p in sys.path if p} | set(interpreter_dirs())
    tmp_keep = {p: os.open(p, os.O_PATH) for p in sorted(tmp_paths)
                if p.startswith("/tmp/") and os.path.isdir(p)}
    wfd = os.open(workdir, os.O_PATH | os.O_DIRECTORY)
    size = f"size={max(16, tmp_mb)}m,mode=1777"
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, size)
    os.mkdir(RUN_DIR, 0o700)
    mount(f"/proc/self/fd/{wfd}", RUN_DIR, None, MS_BIND | MS_REC)
    os.close(wfd)
    for path, fd in tmp_keep.items():
        os.makedirs(path, exist_ok=True)
        mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        os.close(fd)
        mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
    if devices:
        try:
            _private_dev(plan, dev_fds)
        except OSError as exc:  # the host's /dev again (device nodes usable, more visible)
            libc.umount2(b"/dev", 2)  # MNT_DETACH: a half-built /dev is not left behind
            notes.append(f"private /dev failed ({exc}); the host's /dev is visible")
    for extra in ("/var/tmp", "/dev/shm"):
        if os.path.isdir(extra):
            try:
                mount("tmpfs", extra, "tmpfs", MS_NOSUID | MS_NODEV, "size=16m,mode=1777")
            except OSError as exc:
                notes.append(str(exc))
    if home and os.path.isdir(home):
        mount("tmpfs", home, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
        for path, fd in keep.items():
            _bind_fd(fd, path)
            try:
                mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
            except OSError as exc:
                notes.append(f"read-only {path}: {exc}")
    try:
        mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY)
    except OSError as exc:
        notes.append(f"read-only root: {exc}")
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


# --- devices (the GPU worker) ---------------------------------------------------------------
# What a GPU worker needs of /dev: the basic character devices, the GPU driver's nodes (NVIDIA:
# nvidiactl, nvidia<N>, nvidia-uvm(-tools), nvidia-modeset, nvidia-caps/ for MIG; Moore
# Threads: mtgpu*, dri/), nothing else (no disks, no /dev/mem, no other ttys).
BASIC_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
GPU_DEVICE_PREFIXES = ("nvidia", "mtgpu", "dri")
DEV_LINKS = {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
             "stderr": "/proc/self/fd/2"}


DEV_ROOT = "/dev"  # where the host's nodes are read from (tests point it elsewhere)


def _bind_fd(fd: int, target: str) -> None:
    """Bind what the open `fd` names (a folder or a file, opened before the view changed) at
    `target`, made for it; the descriptor is closed."""
    if os.path.isdir(f"/proc/self/fd/{fd}"):
        os.mkdir(target)
    else:
        Path(target).touch()
    mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
    os.close(fd)


def device_plan(dev: str | None = None) -> list[tuple[str, str, str]]:
    """The private /dev, in order: (kind, target under /dev, source), kind one of "tmpfs",
    "bind" (a node or directory of the host's `dev`, present there), "symlink", "shm"."""
    dev = dev or DEV_ROOT
    plan = [("tmpfs", "/dev", "")]
    names = sorted(os.listdir(dev)) if os.path.isdir(dev) else []
    for name in [*BASIC_DEVICES, *(n for n in names if n.startswith(GPU_DEVICE_PREFIXES))]:
        src = os.path.join(dev, name)
        if os.path.exists(src):
            plan.append(("bind", f"/dev/{name}", src))
    plan += [("symlink", f"/dev/{n}", t) for n, t in DEV_LINKS.items()]
    return plan + [("shm", "/dev/shm", "")]


def _private_dev(plan: list[tuple[str, str, str]], fds: dict[str, int]) -> None:
    """Carry out `device_plan()` (bind sources opened as O_PATH `fds` beforehand)."""
    for kind, target, src in plan:
        if kind == "tmpfs":  # no MS_NODEV: the bound nodes must stay usable
            mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=1m,mode=755")
        elif kind == "bind":
            fd = fds.pop(target)
            _bind_fd(fd, target)
        elif kind == "symlink":
            os.symlink(src, target)
        elif kind == "shm":
            os.mkdir(target, 0o1777)
    mount(None, "/dev", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NOEXEC)
