"""`verifier.run.relocations.snapshot`: which mapped files are libraries it keys (ELF objects,
told by the bytes mapped at their first page), each in a fresh interpreter (the mappings are
the process's own)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# a non-ELF file mapped from offset 0 while the snapshot is taken, then unmapped and deleted
ARENA = """
import mmap, os, sys
from verifier.run import relocations
path = os.path.join(sys.argv[1], "arena.bin")
with open(path, "wb") as f:
    f.write(b"\\x00" * 65536)
f = open(path, "r+b")
arena = mmap.mmap(f.fileno(), 65536)
ready = relocations.snapshot()
arena.close(); f.close(); os.unlink(path)
later = relocations.snapshot()
print("ARENA", [k for k in ready if "arena.bin" in k])
print("GONE", [k for k in ready if later.get(k) != ready[k]])
print("LIBS", sum("libc" in k for k in ready))
"""

# a library whose ELF magic in memory is overwritten after the ready snapshot: its key goes
HIDDEN = """
import ctypes, ctypes.util, mmap, os, shutil, sys
from verifier.run import relocations
src = ctypes.util.find_library("m")
lib = next(p for p in ("/lib/x86_64-linux-gnu/" + src, "/usr/lib/x86_64-linux-gnu/" + src)
           if os.path.exists(p))
copy = os.path.join(sys.argv[1], "libhidden.so")
shutil.copy(lib, copy)
ctypes.CDLL(copy)
ready = relocations.snapshot()
key = next(k for k in ready if "libhidden.so" in k)
start = next(int(ln.split("-")[0], 16) for ln in open("/proc/self/maps") if copy in ln)
libc = ctypes.CDLL(None, use_errno=True)
libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
assert libc.mprotect(start, mmap.PAGESIZE, 3) == 0, ctypes.get_errno()
ctypes.memset(start, 0, 4)
libc.mprotect(start, mmap.PAGESIZE, 1)
later = relocations.snapshot()
print("HIDDEN", key in later, later.get(key) != ready[key])
"""


def _run(code: str, tmp_path: Path) -> list[str]:
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                         text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr[-800:]
    return run.stdout.splitlines()


def test_a_mapped_file_that_is_no_library_is_no_key(tmp_path: Path) -> None:
    """An arena file mapped at ready, later unmapped and deleted: no key of the ready snapshot
    changes (before: its key, "arena.bin (GOT and RELRO pages)", was gone, read as residue
    once, round 14's asyncgen case). The libraries (libc) are still keyed."""
    arena, gone, libs = _run(ARENA, tmp_path)
    assert arena == "ARENA []" and gone == "GONE []", (arena, gone)
    assert libs != "LIBS 0", libs


def test_a_library_whose_magic_is_overwritten_loses_its_key(tmp_path: Path) -> None:
    """Overwriting a loaded library's ELF magic in memory (to have it read as no library, its
    GOT unhashed) drops its key, and a key of the ready snapshot that is gone or differs is
    residue (`tamper.left_in_process` compares every key of `before`)."""
    (line,) = _run(HIDDEN, tmp_path)
    assert line == "HIDDEN False True", line
