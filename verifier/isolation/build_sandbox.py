"""The compiler's sandbox: it sees a root made of the toolchain and what its command names.

`build_argv(cmd)` puts a compiler or linker behind a wrapper (`enter_build`) that enters new
user, pid, mount, network and IPC namespaces, forks so the compiler runs in the new pid
namespace, builds a fresh root in a tmpfs (the system trees /usr, /lib*, /bin, /sbin read-only,
the loader's cache and /etc/alternatives, a few /dev nodes, a private /tmp, a /proc of its own
pid namespace, and the folders its command line names: sources, outputs, include folders, the
toolchain), chroots into it, drops every capability and execs. So `/proc/<pid>/root` leads
nowhere but into its own view, and a file outside that view (host secrets, other runs, the
workspace, /etc) cannot be included, `.incbin`-ed or read by a plugin, whatever the source does.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
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

SYSTEM_TREES = ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin")
SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/alternatives")
DEV_NODES = ("null", "zero", "random", "urandom")
ROOT = "/tmp"  # the new root's mount point (any existing folder; the host's is covered)
_ENTER_BUILD = ("import sys; sys.path.insert(0, sys.argv[1]); "
                "from verifier.isolation.build_sandbox import enter_build; enter_build(sys.argv[2:])")


# The wrapper's own failure: a traceback of its `-c` program or its
# message. Raised, so the spec fails in this batch without a cached outcome.
SANDBOX_FAILED = re.compile(r'^\[build sandbox\]|^  File "<string>", line \d+, in <module>',
                            re.MULTILINE)


class BuildSandboxError(RuntimeError):
    """The compiler's sandbox could not run the compiler (the message says why)."""


def build_argv(cmd: list[str]) -> list[str]:
    """`cmd` (a compiler or linker) behind the build wrapper (module docstring), its path
    arguments with links followed: the fresh root holds the folders they lead to, not the links
    (a checkout under /tmp whose .venv links elsewhere names torch's headers through the link)."""
    pkg = str(Path(__file__).resolve().parents[2])
    return [sys.executable, "-S", "-c", _ENTER_BUILD, pkg, *map(_linkless, cmd)]


def _linkless(arg: str) -> str:
    """A path argument (`/...`, `-I/...`, `-L/...`) with its links followed, as `visible_for`
    mounts it; any other argument as it is."""
    head = arg[:2] if arg.startswith(("-I/", "-L/")) else ""
    path = arg[len(head):]
    if not path.startswith("/"):
        return arg
    try:
        return head + os.path.realpath(path)
    except OSError:  # a link it may not follow: left as written (and not mounted)
        return arg


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == r or path.startswith(r + "/") for r in roots)


def visible_for(cmd: list[str]) -> list[str]:
    """Folders the command needs besides the system trees: those its arguments name (the file's
    folder for a file) and its tool's folder, with the toolkit above a `bin` (nvcc's)."""
    # the tool as exec finds it on PATH (a bare "g++" is no file of the working directory)
    tool = os.path.dirname(os.path.realpath(shutil.which(cmd[0]) or cmd[0]))
    want = {tool} | ({os.path.dirname(tool)} if os.path.basename(tool) == "bin" else set())
    for arg in cmd:
        for part in arg.split("=")[-1:] + ([arg[2:]] if arg.startswith(("-I", "-L")) else []):
            if part.startswith("/"):
                try:
                    p = os.path.realpath(part)
                except OSError:  # a link it may not follow (/proc/1/root): not shown
                    continue
                want.add(p if os.path.isdir(p) else os.path.dirname(p))
    system = tuple(os.path.realpath(t) for t in SYSTEM_TREES if os.path.isdir(t))
    out = {p for p in want if p and os.path.isdir(p) and p != "/" and not _under(p, system)}
    keep: list[str] = []  # outermost first; folders inside a kept one come with it
    for p in sorted(out, key=len):
        if not any(p.startswith(k + "/") for k in keep):
            keep.append(p)
    return keep


def enter_build(cmd: list[str]) -> None:
    """In the build wrapper: namespaces, the fresh root, no capabilities, then exec `cmd`."""
    outer_uid, outer_gid = os.getuid(), os.getgid()
    base = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWPID
    for flags in (base | CLONE_NEWUSER, base):  # without a user namespace only as root
        if flags & CLONE_NEWUSER == 0 and os.geteuid() != 0:
            continue
        if libc.unshare(flags) == 0:
            break
    else:
        sys.stderr.write(f"[build sandbox] no namespaces ({os.strerror(ctypes.get_errno())}): "
                         "the compiler cannot be isolated; not run\n")
        os._exit(126)
    if flags & CLONE_NEWUSER:
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"0 {outer_uid} 1")
        Path("/proc/self/gid_map").write_text(f"0 {outer_gid} 1")
    cwd = os.getcwd()
    opened = {p: os.open(p, os.O_PATH) for p in
              [*(t for t in SYSTEM_TREES if os.path.isdir(t) and not os.path.islink(t)),
               *(f for f in SYSTEM_FILES if os.path.exists(f)),
               *(f"/dev/{n}" for n in DEV_NODES if os.path.exists(f"/dev/{n}")),
               *visible_for(cmd)]}
    links = {t: os.readlink(t) for t in SYSTEM_TREES if os.path.islink(t)}
    pid = os.fork()
    if pid != 0:
        wait_and_mirror(pid)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the wrapper's end (a timeout) ends the build
    try:
        _fresh_root(opened, links)
    except OSError as exc:  # fail closed: never compile with the host's view
        sys.stderr.write(f"[build sandbox] could not build the compiler's root: {exc}\n")
        os._exit(126)
    try:
        os.chdir(cwd)
    except OSError:
        os.chdir("/")
    drop_capabilities()
    os.execvp(cmd[0], cmd)


def _fresh_root(opened: dict[str, int], links: dict[str, str]) -> None:
    """Mount the new root at ROOT (see the module docstring) and chroot into it."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("tmpfs", ROOT, "tmpfs", MS_NOSUID | MS_NODEV, "size=16m,mode=755")
    for target, dest in links.items():  # merged /usr: /bin -> usr/bin
        os.symlink(dest, ROOT + target)
    for d in ("tmp", "proc", "dev"):
        os.makedirs(f"{ROOT}/{d}", exist_ok=True)
    # the compiler's scratch space, under the folders named below (a source in the host's /tmp)
    mount("tmpfs", f"{ROOT}/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=4g,mode=1777")
    system = set(SYSTEM_TREES) | set(SYSTEM_FILES)
    for path, fd in sorted(opened.items(), key=lambda kv: len(kv[0])):
        target = ROOT + path
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.makedirs(target, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            Path(target).touch()
        mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
        os.close(fd)
        if path in system:  # the toolchain's own trees: read-only (outputs go to named folders)
            mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_REC)
    try:  # this pid namespace's own processes only
        mount("proc", f"{ROOT}/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError:  # a /proc with masked parts cannot be mounted anew: none at all then
        pass
    if libc.chroot(ROOT.encode()) != 0:
        raise OSError(ctypes.get_errno(), "chroot")
    os.chdir("/")


PR_SET_SECUREBITS, PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 28, 24, 47, 4
# noroot, no setuid fixup, keep caps off, all locked: an exec as uid 0 gains nothing
SECURE_ALL = 0b101111


def drop_capabilities() -> None:
    """No capability now or after exec: bounding and ambient sets emptied, root's exec rule
    off (securebits), the effective, permitted and inheritable sets cleared, no_new_privs."""
    libc.prctl(PR_SET_SECUREBITS, SECURE_ALL, 0, 0, 0)
    for cap in range(64):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (ctypes.c_uint32 * 6)()
    if libc.capset(header, data) != 0:
        raise PermissionError(f"[build sandbox] capset: {os.strerror(ctypes.get_errno())}")
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
