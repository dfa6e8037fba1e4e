"""Code an object runs when it is loaded: what a batch unit's object may not carry.

A batch unit (`verifier.compile.builder`) puts many candidates in one translation unit and one shared
object, and the worker of each candidate loads all of it. Only functions run on a call, so a
batch-mate's functions never run in another candidate's process, but load-time code runs in
every process that loads the object: C++ dynamic initializers of namespace-scope objects
(`TORCH_LIBRARY_IMPL`, `static std::vector<int> t = f();`), `constructor`/`destructor`
attributes, pointers placed in `.init_array`/`.fini_array`/`.ctors`/`.dtors`, IFUNC resolvers.

`load_code(objects)` reads each relocatable ELF object the unit compiled to (its own small
reader: section headers, symbols, RELA entries) and follows every load-time entry through the
functions it reaches, disassembling only those bytes (`objdump -b binary`, milliseconds). What
the compilers put there themselves is allowed, exactly: g++'s `std::ios_base::Init` of
`<iostream>` (a constructor call on the static `__ioinit` and its `__cxa_atexit` registration,
through `_GLOBAL__sub_I_*` and, at -O0, `__static_initialization_and_destruction_0`; clang's
`__cxx_global_var_init`) and nvcc's `__sti____cudaRegisterAll` (clang's `__cuda_module_ctor`,
`__musa_module_ctor`: they register the unit's kernels). Anything else (any indirect call,
any memory reached through a register other than the stack's, a backward jump: a loop that
could spin at load on the stack alone, a system call) is load-time code: the unit is
built again without the candidates it names (`ks_<key>` in a symbol), or in halves where it
names none, until each such candidate is in a shared object of its own. A non-x86-64 object
with any load-time entry counts as having load-time code (the reader knows x86-64 only).
"""

from __future__ import annotations

import re
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

LOAD_CODE = "load-time code in a shared unit:"  # the unit is split; nobody's failure
_LOAD_SECTIONS = (".init_array", ".fini_array", ".ctors", ".dtors", ".preinit_array")
_SHT_SYMTAB, _SHT_RELA, _STT_SECTION, _STT_FUNC, _STT_GNU_IFUNC = 2, 4, 3, 2, 10
_EM_X86_64 = 62
# What g++ and nvcc emit for their own load-time work (see the module docstring).
# g++'s initializer functions and clang's (the MUSA and HIP compilers, CXX=clang++): walked
_HELPERS = re.compile(r"_GLOBAL__sub_I_.*|_Z41__static_initialization_and_destruction_0(ii|v)|"
                      r"__cxx_global_var_init(\.\d+)?")
# the device compilers' own registration of a unit's kernels (nvcc; clang's CUDA, HIP, MUSA):
# compiler-made, never a candidate's (a candidate's names are mangled in its namespace)
_REGISTER = {"_ZL24__sti____cudaRegisterAllv", "__cuda_module_ctor", "__hip_module_ctor",
             "__musa_module_ctor"}
_IOINIT = "_ZStL8__ioinit"
_ALLOWED_EXTERNAL = {"_ZNSt8ios_base4InitC1Ev", "_ZNSt8ios_base4InitD1Ev", "__cxa_atexit",
                     "__dso_handle", _IOINIT}
_SPEC_KEY = re.compile(r"ks_([0-9a-f]{16})")
_INSN = re.compile(r"^\s*([0-9a-f]+):\s+(.*)$")
_BRANCH = re.compile(r"^(call|jmp|j[a-z]+)\w*\s+(\*?)(0x[0-9a-f]+|\S+)")
_TRAPS = re.compile(r"^(syscall|sysenter|int|int3|int1|into|hlt|ud2)\b")
_MEMORY_BASE = re.compile(r"\(%(\w+)")
_STACK_REGS = {"rip", "rsp", "rbp", "esp", "ebp"}


@dataclass
class _Symbol:
    name: str
    value: int
    size: int
    kind: int
    shndx: int


@dataclass
class _Reloc:
    offset: int
    symbol: _Symbol
    addend: int


class _Elf:
    """The sections, symbols and RELA entries of one ELF64 little-endian relocatable object."""

    def __init__(self, data: bytes):
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            raise ValueError("not an ELF64 little-endian object")
        self.data = data
        self.machine = struct.unpack_from("<H", data, 18)[0]
        shoff, = struct.unpack_from("<Q", data, 40)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 58)
        self.sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
                         for i in range(shnum)]
        names = self.sections[shstrndx]
        self.names = [self._str(names[4], s[0]) for s in self.sections]
        self.symbols: list[_Symbol] = []
        for s in self.sections:
            if s[1] == _SHT_SYMTAB:
                strtab = self.sections[s[6]][4]
                for off in range(s[4], s[4] + s[5], 24):
                    name, info, _, shndx, value, size = struct.unpack_from("<IBBHQQ", data, off)
                    self.symbols.append(_Symbol(self._str(strtab, name), value, size, info & 15,
                                                shndx))
        for sym in self.symbols:  # a section symbol is named by its section
            if sym.kind == _STT_SECTION and sym.shndx < len(self.names):
                sym.name = self.names[sym.shndx]

    def _str(self, table: int, off: int) -> str:
        end = self.data.index(b"\0", table + off)
        return self.data[table + off:end].decode("utf-8", "replace")

    def relocs(self, target: int) -> list[_Reloc]:
        """The RELA entries that patch section `target`."""
        out = []
        for s in self.sections:
            if s[1] == _SHT_RELA and s[7] == target:
                for off in range(s[4], s[4] + s[5], 24):
                    where, info, addend = struct.unpack_from("<QQq", self.data, off)
                    out.append(_Reloc(where, self.symbols[info >> 32], addend))
        return out

    def function_at(self, shndx: int, offset: int) -> _Symbol | None:
        return next((s for s in self.symbols if s.shndx == shndx and s.kind == _STT_FUNC
                     and s.value == offset), None)


def load_code(objects: list[Path]) -> str:
    """Why these objects run code at load that the compilers did not put there ("" if none)."""
    reasons = []
    for obj in objects:
        try:
            elf = _Elf(obj.read_bytes())
        except (OSError, ValueError, struct.error, IndexError) as exc:
            reasons.append(f"{obj.name} cannot be read ({exc})")
            continue
        reasons += [f"{obj.name}: {r}" for r in _object_reasons(elf)]
    return "; ".join(reasons)


def no_load_code(objs: list[Path], log: list[str]) -> tuple[bool, list[str]]:
    """(True, log) when the unit's objects run nothing of a candidate's at load; else False and
    only that reason (it names the spec keys it found, which the builder builds alone)."""
    loaded = load_code(objs)
    if not loaded:
        return True, log
    return False, [f"{LOAD_CODE} {loaded}"]


def blamed_keys(reason: str) -> set[str]:
    """Spec keys named by `load_code`'s reason (their symbols are in the load-time code)."""
    return set(_SPEC_KEY.findall(reason))


def _object_reasons(elf: _Elf) -> list[str]:
    reasons = [f"the IFUNC {s.name} runs a resolver at load" for s in elf.symbols
               if s.kind == _STT_GNU_IFUNC]
    for i, name in enumerate(elf.names):
        if not name.startswith(_LOAD_SECTIONS) or name.startswith(".rela"):
            continue
        entries = elf.relocs(i)
        if len(entries) * 8 < elf.sections[i][5]:
            reasons.append(f"{name} holds an address no relocation names")
        for r in entries:
            fn = r.symbol if r.symbol.kind == _STT_FUNC else elf.function_at(r.symbol.shndx,
                                                                            r.addend)
            if fn is None:
                reasons.append(f"{name} names {r.symbol.name}+{r.addend:#x}, not a function")
            elif fn.name not in _REGISTER:
                reasons += _walk(elf, fn, name)
    return list(dict.fromkeys(reasons))


def _walk(elf: _Elf, entry: _Symbol, where: str) -> list[str]:
    """Reasons the functions `entry` reaches do more than the compilers' own load-time work."""
    if not _HELPERS.fullmatch(entry.name):
        return [f"{where} runs {entry.name}"]
    if elf.machine != _EM_X86_64:
        return [f"{where} runs {entry.name} (machine {elf.machine}: not read)"]
    reasons, seen, todo = [], set(), [entry]
    while todo:
        fn = todo.pop()
        if (fn.shndx, fn.value) in seen:
            continue
        seen.add((fn.shndx, fn.value))
        relocs = [r for r in elf.relocs(fn.shndx) if fn.value <= r.offset < fn.value + fn.size]
        try:
            insns = _disassemble(elf.data[elf.sections[fn.shndx][4] + fn.value:][:fn.size],
                                 fn.value)
        except (OSError, subprocess.SubprocessError) as exc:  # no binutils: not read, not safe
            reasons.append(f"{fn.name} could not be disassembled ({exc})")
            continue
        for k, (addr, text) in enumerate(insns):
            end = insns[k + 1][0] if k + 1 < len(insns) else fn.value + fn.size
            here = [r for r in relocs if addr <= r.offset < end]
            for r in here:
                why, helper = _judge_target(elf, r)
                if why:
                    reasons.append(f"{fn.name} refers to {why}")
                elif helper is not None:
                    todo.append(helper)
            branch = _BRANCH.match(text)
            if _TRAPS.match(text):
                reasons.append(f"{fn.name} enters the kernel ({text.split()[0]})")
            if branch and branch.group(2):
                reasons.append(f"{fn.name} makes an indirect {branch.group(1)}")
            elif branch and not here and branch.group(3).startswith("0x"):
                target = int(branch.group(3), 16)
                inside = fn.value <= target < fn.value + fn.size
                if inside and target <= addr and branch.group(1) != "call":
                    reasons.append(f"{fn.name} loops at load")  # the compilers' own is straight
                elif not inside:
                    callee = elf.function_at(fn.shndx, target)
                    if callee is None or not _HELPERS.fullmatch(callee.name):
                        reasons.append(f"{fn.name} calls {callee.name if callee else hex(target)}")
                    else:
                        todo.append(callee)
            for reg in _MEMORY_BASE.findall(text):
                if reg not in _STACK_REGS:
                    reasons.append(f"{fn.name} reaches memory through %{reg}")
            if "%fs:" in text.replace("%fs:0x28", "") or "%gs:" in text:
                reasons.append(f"{fn.name} reaches thread-local memory")
            if "(%rip)" in text and not here:
                reasons.append(f"{fn.name} reaches memory no relocation names")
    return reasons


def _judge_target(elf: _Elf, r: _Reloc) -> tuple[str, _Symbol | None]:
    """("", helper to follow or None) for an allowed relocation target, else (what it is, None)."""
    sym = r.symbol
    if sym.kind != _STT_SECTION:
        if sym.name in _ALLOWED_EXTERNAL:
            return "", None
        if _HELPERS.fullmatch(sym.name) and sym.shndx:
            return "", sym
        return sym.name, None
    for off in (r.addend + 4, r.addend):  # pc-relative (addend - 4) or absolute
        for s in elf.symbols:
            if s.shndx == sym.shndx and s.value <= off < s.value + max(1, s.size) and (
                    s.name == _IOINIT or (s.kind == _STT_FUNC and _HELPERS.fullmatch(s.name))):
                return "", (s if s.kind == _STT_FUNC and s.value == off else None)
    named = [s.name for off in (r.addend + 4, r.addend) for s in elf.symbols
             if s.shndx == sym.shndx and s.kind != _STT_SECTION and s.name
             and s.value <= off < s.value + max(1, s.size)]
    return (named[0] if named else f"{sym.name}+{r.addend:#x}"), None


def _disassemble(code: bytes, vma: int) -> list[tuple[int, str]]:
    """(address, instruction text) of x86-64 `code` placed at `vma`."""
    if not code:
        return []
    with tempfile.NamedTemporaryFile(suffix=".bin") as f:
        f.write(code)
        f.flush()
        out = subprocess.run(["objdump", "-D", "-b", "binary", "-m", "i386:x86-64", "-w",
                              "--no-show-raw-insn", f"--adjust-vma={vma:#x}", f.name],
                             capture_output=True, text=True, timeout=60, check=True).stdout
    insns = []
    for line in out.splitlines():
        m = _INSN.match(line)
        if m:
            insns.append((int(m.group(1), 16), m.group(2).split("#")[0].strip()))
    return insns
