"""Function names of code addresses in ELF objects, read from their symbol tables (stdlib only).

The judge's instruction-pointer samples (`verifier.judge.ip_sampler`) say which object a run's
time was in; this says which function of it: torch's libraries keep a full `.symtab`, so a
sample in libtorch_cpu names its aten kernel (a copy, a fill, or the task's own op)."""

from __future__ import annotations

import bisect
import mmap
import os
import struct
from array import array
from functools import lru_cache

_SHT_SYMTAB, _SHT_DYNSYM, _PT_LOAD, _STT_FUNC = 2, 11, 1, 2


class Symbols:
    """The function symbols of one ELF file, sorted by address, names read on lookup."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.starts = array("Q")
        self.ends = array("Q")
        self.names = array("Q")  # offsets of the names in the string table
        self.loads: list[tuple[int, int, int]] = []  # PT_LOAD: (file offset, vaddr, size)
        self._strtab = (0, 0)
        with open(path, "rb") as f:
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._read()

    def _read(self) -> None:
        mm = self._mm
        if mm[:4] != b"\x7fELF" or mm[4] != 2:  # ELF64 only (x86_64 is what is sampled)
            return
        phoff, shoff = struct.unpack_from("<QQ", mm, 0x20)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", mm, 0x36)
        for i in range(phnum):
            p_type, _, p_off, p_vaddr, _, p_filesz = struct.unpack_from(
                "<IIQQQQ", mm, phoff + i * phentsize)
            if p_type == _PT_LOAD:
                self.loads.append((p_off, p_vaddr, p_filesz))
        sections = [struct.unpack_from("<IIQQQQIIQQ", mm, shoff + i * shentsize)
                    for i in range(shnum)]
        table = next((s for s in sections if s[1] == _SHT_SYMTAB), None) or \
            next((s for s in sections if s[1] == _SHT_DYNSYM), None)
        if table is None:
            return
        strtab = sections[table[6]]
        self._strtab = (strtab[4], strtab[5])
        with memoryview(mm) as view:  # no copy of the table (libtorch_cpu's: 12 MB)
            funcs = sorted((value, size, name) for name, info, _, _, value, size in
                           struct.iter_unpack("<IBBHQQ", view[table[4]:table[4] + table[5]])
                           if info & 0xF == _STT_FUNC and value and size)
        # arrays, not lists of ints: libtorch_cpu has ~380k functions, kept per verifier process
        self.starts = array("Q", (f[0] for f in funcs))
        self.ends = array("Q", (f[0] + f[1] for f in funcs))
        self.names = array("Q", (f[2] for f in funcs))

    def vaddr(self, file_offset: int) -> int | None:
        """The link-time address of a file offset (None outside every loaded segment)."""
        for off, vaddr, size in self.loads:
            if off <= file_offset < off + size:
                return vaddr + file_offset - off
        return None

    def name_at(self, file_offset: int) -> str:
        """The (mangled) name of the function holding `file_offset`, or "" when none does."""
        addr = self.vaddr(file_offset)
        if addr is None:
            return ""
        i = bisect.bisect_right(self.starts, addr) - 1
        if i < 0 or addr >= self.ends[i]:
            return ""
        lo = self._strtab[0] + self.names[i]
        hi = self._mm.find(b"\0", lo, self._strtab[0] + self._strtab[1])
        return self._mm[lo:hi if hi >= 0 else lo].decode("utf-8", "replace")


@lru_cache(maxsize=16)
def _symbols(path: str, inode: int, mtime_ns: int) -> Symbols:
    return Symbols(path)


def symbols_of(path: str) -> Symbols | None:
    """The symbols of the file at `path` (cached per file version), None if it cannot be read."""
    try:
        st = os.stat(path)
        return _symbols(path, st.st_ino, st.st_mtime_ns)
    except (OSError, ValueError, struct.error):
        return None
