"""The dynamic linker's tables of the worker's loaded libraries, as residue
(`verifier.run.tamper.process_state`, through `thread_settings.snapshot`).

A library calls another's function through its global offset table: an address the dynamic
linker wrote at load. A job that writes another address there (`mprotect` the RELRO page
writable, write, make it read-only again: /proc/self/maps reads as before, no Python object
changes) sends every later job's call elsewhere: numpy's `memmove` pointed at libc's `memset`
made a later honest ReLU that copies its result "incorrect", the judge's own failure, which
stands (tests/verifier/test_redteam_round16.py). So each library loaded when the worker was
ready keeps, by its path:
- a hash of its RELRO (`PT_GNU_RELRO`: the GOT, and `.data.rel.ro`'s vtables and typeinfo;
  constant after loading) where that is at most `WHOLE_RELRO_MAX` (torch's, numpy's,
  libpython's: libtorch_cpu's is 2.7 MiB), else of its GOT inside RELRO only (`.got`, and
  `.got.plt` of a library linked `-z now`). Hashing every library's whole RELRO on an H100
  (cuBLAS, cuDNN: 31 MB) made each settle 0.14 s slower (0.29 -> 0.43 s median over
  KernelBench's batch); GOTs alone left the vtables open, and a job that pointed
  `c10::TensorImpl`'s deleting destructor at a slow hook made later honest ReLUs 13x slower,
  verdicts standing (tests/verifier/test_redteam_round17.py). Open: a vtable of a vendor
  library past the bound;
- a hash of its lazily bound GOT entries (`.rela.plt` outside RELRO) that were bound at its
  first snapshot (the ready worker's: `_BOUND`; pointing outside its `.plt` stubs). An entry
  not yet bound then would be bound at its first call, by any job, and could not be compared (a
  job repointed one), so the persistent workers run with `LD_BIND_NOW`
  (`verifier.run.gpu_pool.WORKER_ENV`): every entry is bound at load, and all are compared.
Read through /proc/self/mem (no ctypes object of the process's answers it). Headers are parsed
once per file; the hashes cost ~9 ms a snapshot on the 2-core CI host (`process_state`: 47 ->
56 ms with torch and numpy loaded).
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
from array import array
from functools import cache

_PT_LOAD, _PT_GNU_RELRO, _SHT_RELA, _R_JUMP_SLOT = 1, 0x6474E552, 4, 7
_BOUND: dict[str, tuple[int, ...] | None] = {}  # lazy GOT entries bound at the first snapshot
WHOLE_RELRO_MAX = 4 << 20  # bytes of RELRO hashed whole; a larger one: its GOT only


@cache
def _layout(path: str, _stamp: tuple[int, int]) -> tuple[int, tuple[tuple[int, int], ...],
                                                     tuple[int, ...], tuple[int, int]]:
    """(the first PT_LOAD's vaddr, the (vaddr, size) of what is hashed of RELRO (all of it
    up to WHOLE_RELRO_MAX or where the file has no section names, else its GOT sections),
    lazily bound GOT entries' vaddrs outside it, the PLT stubs' (start, end)) of an ELF file;
    zeros for what is no 64-bit ELF."""
    with open(path, "rb") as f:
        data = f.read(64)
        if data[:6] != b"\x7fELF\x02\x01":
            return 0, (), (), (0, 0)
        phoff, shoff = struct.unpack_from("<QQ", data, 0x20)
        phsize, phnum, shsize, shnum, shstr = struct.unpack_from("<HHHHH", data, 0x36)
        f.seek(phoff)
        heads = [struct.unpack_from("<IIQQQQQQ", f.read(phsize)) for _ in range(phnum)]
        first = min((h[3] for h in heads if h[0] == _PT_LOAD), default=0)
        relro = next(((h[3], h[5]) for h in heads if h[0] == _PT_GNU_RELRO), (0, 0))
        f.seek(shoff)
        secs = [struct.unpack("<IIQQQQIIQQ", f.read(shsize)) for _ in range(shnum)]
        if shstr >= len(secs):
            return first, (relro,), (), (0, 0)
        f.seek(secs[shstr][4])
        names = f.read(secs[shstr][5])
        slots: list[int] = []
        plt = [(s[3], s[3] + s[5]) for s in secs if names[s[0]:s[0] + 5] == b".plt\0"
               or names[s[0]:s[0] + 9] == b".plt.sec\0"]
        end = relro[0] + relro[1]  # each GOT section's bytes inside RELRO (all of a small one)
        got = ((relro,) if relro[1] <= WHOLE_RELRO_MAX else ()) or tuple(
            (max(s[3], relro[0]), min(s[3] + s[5], end) - max(s[3], relro[0]))
            for s in secs if names[s[0]:names.index(b"\0", s[0])] in (b".got", b".got.plt")
            and s[3] < end and relro[0] < s[3] + s[5])
        for s in secs:
            if s[1] == _SHT_RELA and names[s[0]:names.index(b"\0", s[0])] == b".rela.plt":
                f.seek(s[4])
                table = f.read(s[5])
                slots += [where for where, info, _ in struct.iter_unpack("<QQq", table)
                          if info & 0xFFFFFFFF == _R_JUMP_SLOT
                          and not relro[0] <= where < relro[0] + relro[1]]
    stubs = (min(p[0] for p in plt), max(p[1] for p in plt)) if plt else (0, 0)
    return first, got, tuple(slots), stubs


def _objects(mem: int = -1) -> dict[str, tuple[int, int, int]]:
    """Each ELF object mapped from offset 0: (its first mapping's start, the end of its last,
    inode). A file that is no ELF in memory (an arena a job or the harness maps) has no GOT and
    is no key: one mapped at ready and later unmapped read as residue (round 14's asyncgen
    case, `arena.bin`). A library whose magic a job overwrote drops its key: a key of the
    ready snapshot gone is residue (`tamper.left_in_process`); an unreadable first page stays.
    The first such mapping in address order: a job that mapped a copy of numpy's library, its
    GOT as loaded, below it (the file's first page over the copy's) had the copy's GOT hashed,
    its write to the real one unseen (tests/verifier/test_redteam_round19.py); the start is
    hashed with the tables (`_digest`), a library loaded does not move."""
    if mem < 0:  # (the tests' call) its own read of the process's memory
        mem = os.open("/proc/self/mem", os.O_RDONLY)
        try:
            return _objects(mem)
        finally:
            os.close(mem)
    out: dict[str, tuple[int, int, int]] = {}
    skip: set[str] = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) < 6 or not parts[5].startswith("/"):
                continue
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            path = parts[5].rstrip("\n")
            if path in out:
                out[path] = (out[path][0], hi, out[path][2])
            elif int(parts[2], 16) == 0 and path not in skip:
                if _magic(mem, lo) in (b"\x7fELF", b""):
                    out[path] = (lo, hi, int(parts[4]))
                else:
                    skip.add(path)
    return out


def _magic(mem: int, at: int) -> bytes:
    """The first four bytes mapped at `at` (b"" where the page cannot be read)."""
    try:
        return os.pread(mem, 4, at)
    except OSError:
        return b""


def _digest(mem: int, path: str, where: tuple[int, int, int]) -> int:
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):  # a device's mapping (/dev/nvidia*): never read
        return 0
    first, got, slots, (plt_lo, plt_hi) = _layout(path, (st.st_ino, st.st_mtime_ns))
    base = where[0] - (first & ~0xFFF)
    h = hashlib.blake2b(digest_size=8)
    h.update(where[0].to_bytes(8, "little"))  # where it is: a decoy mapped below (`_objects`)
    for at, size in got:
        h.update(os.pread(mem, size, base + at))
    if slots:  # one read of the table (`.got.plt`: the slots are contiguous)
        lo = min(slots)
        table = os.pread(mem, max(slots) + 8 - lo, base + lo)
        values = memoryview(table).cast("Q")
        if path not in _BOUND:  # the entries not at a PLT stub: bound (None: all of the table)
            bound = [(s - lo) // 8 for s in slots if not plt_lo <= values[(s - lo) // 8] - base
                     < plt_hi]
            _BOUND[path] = None if len(bound) == len(values) else tuple(bound)
        index = _BOUND[path]
        h.update(table if index is None else array("Q", map(values.__getitem__, index)))
    return int.from_bytes(h.digest(), "little")


def snapshot() -> dict[str, int]:
    """A key per loaded library: the hash of its GOT in RELRO and its bound lazy GOT entries (-1
    where it cannot be read)."""
    out: dict[str, int] = {}
    try:
        mem = os.open("/proc/self/mem", os.O_RDONLY)
    except OSError:
        return {"GOT and RELRO pages (unreadable)": -1}
    try:
        for path, where in _objects(mem).items():
            try:
                out[f"{path} (GOT and RELRO pages)"] = _digest(mem, path, where)
            except (OSError, ValueError, struct.error):
                out[f"{path} (GOT and RELRO pages)"] = -1
    finally:
        os.close(mem)
    return out
