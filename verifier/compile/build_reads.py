"""What a build's compiles read, from their `-MD` lists, against where they may read: the include
folders their commands pass, the compilers' own folders and search lists (a read elsewhere
refuses the build, `verifier.compile.builder`)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

_SEARCH_LIST = re.compile(r"#include <\.\.\.> search starts here:\n(.*?)End of search list",
                          re.S)


def compiler_search_dirs(cxx: str) -> list[str]:
    """The compiler's own system include folders (`-v`), cached per compiler."""
    if cxx not in _SEARCH_DIRS:
        try:
            proc = subprocess.run([cxx, "-x", "c++", "-E", "-v", "-"], input="", text=True,
                                  capture_output=True, timeout=120, errors="replace")
        except (OSError, subprocess.TimeoutExpired):  # no such compiler: it adds no folder
            return []  # (not cached: it may be installed later), and the build reports the read
        m = _SEARCH_LIST.search(proc.stderr)
        _SEARCH_DIRS[cxx] = [ln.strip().split(" (")[0] for ln in
                             (m.group(1).splitlines() if m else []) if ln.strip()]
    return _SEARCH_DIRS[cxx]


_SEARCH_DIRS: dict[str, list[str]] = {}


def nvcc_host_compiler(cmd: list[str]) -> str:
    """The host compiler an nvcc command line runs: its `-ccbin`/`--compiler-bindir`, else
    g++ on PATH (nvcc's own default)."""
    for i, arg in enumerate(cmd):
        if arg in ("-ccbin", "--compiler-bindir") and i + 1 < len(cmd):
            return cmd[i + 1]
        if arg.startswith(("-ccbin=", "--compiler-bindir=")):
            return arg.split("=", 1)[1]
    return "g++"


def read_dependencies(dep_file: str) -> list[str]:
    """The files a compile read, from its `-MD -MF` file (make syntax: escaped spaces, line
    continuations, the target before the first unescaped colon)."""
    with open(dep_file, encoding="utf-8", errors="replace") as fh:
        text = fh.read().replace("\\\n", " ")
    out: list[str] = []
    for rule in text.splitlines():
        _, sep, deps = rule.partition(": ")
        if not sep:
            continue
        for word in re.split(r"(?<!\\)\s+", deps.strip()):
            if word:
                out.append(word.replace("\\ ", " ").replace("$$", "$"))
    return out


def _real(path: str) -> str:
    """The path with links followed; as written where a link cannot be read (/proc/1/root)."""
    try:
        return os.path.realpath(path)
    except OSError:
        return os.path.abspath(path)


def outside(paths: list[str], roots: list[str], cwd: str) -> list[str]:
    """The paths (resolved, links followed) under none of `roots`."""
    real_roots = [_real(r).rstrip("/") + "/" for r in roots if r]
    bad = []
    for p in paths:
        real = _real(os.path.join(cwd, p))
        if not any((real + "/").startswith(r) for r in real_roots):
            bad.append(p)
    return list(dict.fromkeys(bad))


UNKNOWN_READ = "(unknown: the compiler left no complete record of what it read)"


def unallowed_reads(log: list[str], deps: list[Path], allowed: list[str],
                    excluded: list[str], host_compiler: str, failed: bool = False) -> list[str]:
    """Files a build's compiles read (their `-MD` lists `deps`) outside the allowlist: the
    include folders its commands (`$ ` lines of `log`) pass, except `excluded` (a candidate's
    extra_include_paths), the compilers' folders and toolkits, the host compiler's system
    include folders, and `allowed` (the unit's folder, the PCH). A compile that left no list,
    or whose output was cut (a flood could hide what it read), counts as an unknown read,
    unless the build `failed` (a fatal error writes no list): then its error is what the
    candidate needs, and it can quote nothing but what its sandbox shows it, the toolchain's
    trees and its command's own folders (`verifier.isolation.build_sandbox`)."""
    cmds = [shlex.split(ln[2:]) for ln in log if ln.startswith("$ ")]
    own = {_real(p) for p in excluded}
    roots = list(allowed)
    for cmd in cmds:
        tool = os.path.realpath(shutil.which(cmd[0]) or cmd[0])
        roots += [os.path.dirname(tool), os.path.dirname(os.path.dirname(tool))]
        for i, arg in enumerate(cmd):
            path = (cmd[i + 1] if arg in ("-I", "-isystem") and i + 1 < len(cmd) else
                    arg[2:] if arg.startswith("-I") and len(arg) > 2 else "")
            if path and _real(path) not in own:
                roots.append(path)
    # a compiler in /usr/bin makes /usr a root: only its include folders count there
    roots = [r for r in roots if _real(r) not in ("/", "/usr", "/usr/local", "/bin",
                                                             "/usr/bin", "/usr/local/bin")]
    roots += compiler_search_dirs(host_compiler)
    for cmd in cmds:  # nvcc hands its host side to `-ccbin`'s compiler, else to g++ on PATH,
        # which need not be `host_compiler` (a toolkit image: CXX=/opt/gcc/bin/g++, g++ 13)
        if os.path.basename(cmd[0]).startswith("nvcc"):
            roots += compiler_search_dirs(nvcc_host_compiler(cmd))
    ran = [d for d in deps if d.is_file()]
    if len(ran) < len(deps) and any("timed out" in ln for ln in log):
        return []  # killed before it said anything: only the timeout is reported
    if any(len(ln) >= 200_000 for ln in log) or (
            len(ran) < len(deps) and not failed and not missing_own_header(log, allowed)):
        return [UNKNOWN_READ]
    read = [p for d in ran for p in read_dependencies(str(d))]
    cwd = os.getcwd()
    # nvcc's list also names the units' own `#line` files (`<key>/cuda0`, ks_bindings.cpp),
    # which are no files: nothing was read there
    read = [p for p in read if not (_LINE_NAME.fullmatch(p)
                                    and not os.path.lexists(os.path.join(cwd, p)))]
    return outside(read, roots, cwd)


def missing_own_header(log: list[str], allowed: list[str]) -> bool:
    """Whether a compile stopped at a header that a unit's own source names and that does not
    exist (`#include <cublas_v2.h>` where there is none): gcc then writes no `-MD` list, but
    nothing was read past the compiler's root (which holds only the allowlisted folders), and
    the candidate needs the compiler's own words, not "unknown"."""
    roots = [_real(a).rstrip("/") + "/" for a in allowed if a]
    for chunk in log:
        for m in _FATAL_MISSING.finditer(chunk):
            src = m.group(1)
            if _LINE_NAME.fullmatch(src) or any(_real(src).startswith(r) for r in roots):
                return True
    return False


_FATAL_MISSING = re.compile(r"^(\S+?):\d+:\d+: fatal error: \S+: No such file or directory$",
                            re.M)
_LINE_NAME = re.compile(r"[0-9a-f]{8,64}/(cpp|cuda)\d+|ks_bindings\.cpp")
