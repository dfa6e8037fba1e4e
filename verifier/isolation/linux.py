"""The Linux calls both sandboxes make (the runs', `verifier.isolation.isolate`, and the compiler's,
`verifier.isolation.build_sandbox`, the fork server's children): namespace and mount flags, mount(2), a
network namespace of one's own, and the outer process that ends as the namespace's pid 1 ended."""

from __future__ import annotations

import ctypes
import os
import signal
from pathlib import Path

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID = 0x00020000, 0x10000000, 0x20000000
CLONE_NEWNET, CLONE_NEWIPC = 0x40000000, 0x08000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]


def mount(src: str | None, target: str, fstype: str | None, flags: int,
          data: str | None = None) -> None:
    """mount(2), raising OSError naming the target."""
    enc = [None if s is None else s.encode() for s in (src, target, fstype, data)]
    if libc.mount(enc[0], enc[1], enc[2], flags, enc[3]) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def wait_and_mirror(pid: int) -> None:
    """Outer process: wait for pid 1 of the namespace, then end the same way it did."""
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to reset
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def unshare_network() -> bool:
    """Move the calling (single-threaded) process into a new, empty network namespace."""
    if libc.unshare(CLONE_NEWNET) == 0:
        return True
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
        return False
    try:  # map ourselves to root inside the namespace, as `unshare -r` does
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"0 {uid} 1")
        Path("/proc/self/gid_map").write_text(f"0 {gid} 1")
    except OSError:
        return True  # the namespace exists; only the id mapping failed
    return True
