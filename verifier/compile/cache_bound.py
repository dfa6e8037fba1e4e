"""Size bound of the build cache: least recently used entries are removed first, never one a
running build may use.

A cache directory holds one root per (backend, torch build, toolchain) (`verifier.compile.builder`), so
every new compiler or torch adds a root and the old ones are never read again. Its entries are
the build folders (`<root>/builds/*`: shared objects), the precompiled headers (`<root>/pch/*`,
~750 MB each) and the index files (`<root>/index/*.json`). The builder touches an entry each
time it uses one, so an entry's newest mtime (or atime, where the mount keeps it) is its last
use.

A compile that uses an entry (a precompiled header) holds it (`hold`: a shared flock on the
entry) while it runs; `trim` removes an entry only under an exclusive one it gets at once, so it
never removes what a live compile holds, and one that comes while the entry goes sees it gone.

A build marks itself with a lease (`build_lease`: a file under `<cache>/.leases` it holds an
exclusive flock on; a lease whose owner died is unlocked and removed). `trim` never removes an
entry used since the oldest live lease began, nor one used in the last `grace_s` seconds (users
of `Builder` that take no lease, such as benchmarks), nor a precompiled header being built.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MAX_GB = 5.0
LEASES = ".leases"
_seq = itertools.count()


@dataclass
class Entry:
    path: Path
    size: int  # bytes
    used: float  # last use: the newest access or modification time in it


def touch(path: Path) -> None:
    """Record a use of a cache entry (its mtime is its last use)."""
    try:
        os.utime(path)
    except OSError:  # removed meanwhile: the next lookup misses and rebuilds
        pass


@contextmanager
def build_lease(cache_dir: Path) -> Iterator[None]:
    """While held, `trim` keeps every entry of `cache_dir` used since it began."""
    leases = cache_dir / LEASES
    leases.mkdir(parents=True, exist_ok=True)
    name = f"{os.getpid()}-{next(_seq)}"
    tmp = leases / f".{name}"
    fd = os.open(tmp, os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.replace(tmp, leases / name)  # visible only once locked: never taken for a dead one
        yield
    finally:
        (leases / name).unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)
        os.close(fd)


# a trim holds an entry's exclusive lock only while it renames it; any process that can open
# the entry can hold one forever (a job of a worker that sees the cache, the cache's folder
# outside the hidden home): a compile waiting for it without a bound never started
# (tests/verifier/test_redteam_round9b.py); past this wait it goes on without the entry
HOLD_WAIT_S = 10.0


def _shared(fd: int) -> bool:
    """Take a shared lock on `fd`, waiting at most HOLD_WAIT_S; whether it was taken."""
    end = time.monotonic() + HOLD_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= end:
                return False
            time.sleep(0.01)


@contextmanager
def hold(entry: Path) -> Iterator[bool]:
    """While held, `trim` leaves `entry` where it is; yields whether it is still there (False:
    gone, removed while this waited for it, or locked past HOLD_WAIT_S: not to be used)."""
    try:
        fd = os.open(entry, os.O_RDONLY)
    except OSError:
        yield False
        return
    try:
        there = _shared(fd)
        try:
            here, held = os.stat(entry), os.fstat(fd)
            there = there and (here.st_dev, here.st_ino) == (held.st_dev, held.st_ino)
        except OSError:
            there = False
        yield there
    finally:
        os.close(fd)


@contextmanager
def hold_made(find: Callable[[], Path | None], ready: str) -> Iterator[Path | None]:
    """The entry `find` returns (made or waited for again when it went before it was held),
    held while in use, once its file `ready` is there; None when there is none."""
    for _ in range(2):
        entry = find()
        if entry is None:
            break
        with hold(entry) as there:
            if there and (entry / ready).is_file():
                touch(entry)
                yield entry
                return
    yield None


def oldest_lease(cache_dir: Path) -> float | None:
    """When the oldest live lease began (None: no build holds one); removes dead ones."""
    oldest = None
    try:
        names = [n for n in os.listdir(cache_dir / LEASES) if not n.startswith(".")]
    except OSError:
        return None
    for name in names:
        path = cache_dir / LEASES / name
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:  # held: a build is running
            began = os.fstat(fd).st_mtime
            oldest = began if oldest is None else min(oldest, began)
        else:  # nobody holds it: its owner died
            path.unlink(missing_ok=True)
        finally:
            os.close(fd)
    return oldest


def _measure(path: Path) -> Entry:
    st = path.stat()
    if path.is_file():
        return Entry(path, st.st_size, max(st.st_mtime, st.st_atime))
    size, used = 0, st.st_mtime
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                st = os.stat(os.path.join(dirpath, f))
            except OSError:
                continue
            size += st.st_size
            used = max(used, st.st_mtime, st.st_atime)  # atime: where the mount records it
    return Entry(path, size, used)


def entries(cache_dir: Path) -> list[Entry]:
    """Every entry of every root of `cache_dir`."""
    out = []
    roots = [r for r in cache_dir.iterdir() if r.is_dir() and not r.name.startswith(".")] \
        if cache_dir.is_dir() else []
    for root in roots:
        for kind in ("builds", "pch", "index"):
            try:
                children = list((root / kind).iterdir())
            except OSError:
                continue
            for child in children:
                try:
                    out.append(_measure(child))
                except OSError:  # removed meanwhile
                    continue
    return out


def _in_use(e: Entry, since: float | None, now: float, grace_s: float) -> bool:
    used = _measure(e.path).used  # again: used since it was listed?
    if used >= now - grace_s or (since is not None and used >= since):
        return True
    return e.path.parent.name == "pch" and (e.path / ".lock").exists()  # being built


def _remove(path: Path) -> bool:
    """Out of the builder's sight at once (rename), then deleted; a root left empty goes too.
    False when it was gone already or a compile holds it."""
    trash = path.parent.parent / f".trash-{os.getpid()}-{next(_seq)}"
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.replace(path, trash)
    except BlockingIOError:  # a compile holds it (`hold`)
        return False
    except FileNotFoundError:
        return False
    finally:
        os.close(fd)  # a compile that waited for it now finds it gone
    if trash.is_dir():
        shutil.rmtree(trash, ignore_errors=True)
    else:
        trash.unlink(missing_ok=True)
    root = path.parent.parent
    for d in (root / "builds", root / "pch", root / "index", root):
        try:
            d.rmdir()  # only when empty
        except FileNotFoundError:
            continue
        except OSError:
            break
    return True


def trim(cache_dirs: Iterable[Path], max_bytes: int, grace_s: float = 600.0) -> list[Path]:
    """Remove least recently used entries of `cache_dirs` (one bound over all of them) until
    they hold at most `max_bytes`; entries a build may be using stay (module docstring), so
    the total can stay above the bound. Returns what was removed, oldest first."""
    dirs = [Path(d) for d in cache_dirs]
    found = [(e, d) for d in dirs for e in entries(d)]
    total = sum(e.size for e, _ in found)
    if total <= max_bytes:
        return []
    leases = {d: oldest_lease(d) for d in dirs}
    now = time.time()
    removed = []
    for e, d in sorted(found, key=lambda x: x[0].used):
        if total <= max_bytes:
            break
        try:
            if _in_use(e, leases[d], now, grace_s) or not _remove(e.path):
                continue
        except FileNotFoundError:  # removed by another trim meanwhile
            continue
        total -= e.size
        removed.append(e.path)
    return removed
