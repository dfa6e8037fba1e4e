"""What the preprocessor will see in a candidate's C++/CUDA source, as the compiler sees it.

`scan_source` runs translation phases 1-3 itself (trigraphs, line splices with trailing blanks,
comments, string and raw-string literals, digraphs) and lists every directive in the text: the
macros it defines or undefines, the headers it includes (with the raw lines that hold them, for
hoisting), and the reasons it cannot share a translation unit with other candidates (`alone`:
built as a unit of its own, where nothing of it can reach another candidate) or cannot be built
at all (`reject`: it reads files the build must not see). A batch unit (`verifier.build`) holds
a source only when its scan has no `alone` reason, and restores every macro it touched after it.
`macro_baseline` asks the compiler which macros exist before the candidates' code (`-dM`), so
a candidate that redefines or undefines one of them (a header's or a predefined macro, which an
`#undef` cannot restore) is built alone too.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

_TRIGRAPH = re.compile(r"\?\?[=/'()!<>\-]")
_TRIGRAPHS = {"=": "#", "/": "\\", "'": "^", "(": "[", ")": "]", "!": "|", "<": "{", ">": "}",
              "-": "~"}
_SPLICE = re.compile(r"\\[ \t\f\v]*\n")
_IDENT = re.compile(r"[A-Za-z_]\w*")
# Directives an honest kernel uses that a batch unit can neutralise (conditionals balanced,
# defines undone after the candidate, literal includes hoisted to the unit's top).
_BATCH_OK = {"define", "undef", "include", "if", "ifdef", "ifndef", "elif", "elifdef",
             "elifndef", "else", "endif", "pragma", "error", "warning", ""}
# Directives that read files: anything but a literal include of a relative header is refused.
_READS_FILES = {"embed", "include_next", "import"}
# Pragmas that change nothing after the statement they annotate (or the file they are in).
_PRAGMA_OK = {("omp",), ("unroll",), ("nounroll",), ("GCC", "unroll"), ("GCC", "ivdep"),
              ("once",), ("message",)}
_OMP_STATEFUL = {"declare", "requires", "threadprivate", "begin", "end", "assumes"}
# Identifiers whose effect reaches past the candidate's own code (pragma operators, counters
# shared by the whole unit) or whose only use is to probe files.
_ALONE_IDENTS = {"_Pragma", "__COUNTER__"}
_READ_IDENTS = {"__has_include", "__has_include_next", "__has_embed"}
_ASM_IDENTS = {"asm", "__asm__", "__asm"}


@dataclass
class Directive:
    """One preprocessing directive: its name, its tokens' text, the raw lines it spans."""

    name: str
    text: str
    first_line: int  # 0-based raw line
    last_line: int


@dataclass
class SourceScan:
    """What a source does to the preprocessor (see the module docstring)."""

    directives: list[Directive] = field(default_factory=list)
    macros: list[str] = field(default_factory=list)  # names defined or undefined, in order
    includes: list[str] = field(default_factory=list)  # literal header operands, `<x>`/`"x"`
    alone: list[str] = field(default_factory=list)
    reject: list[str] = field(default_factory=list)
    code: str = ""  # the text after phase 3 with its literals blanked (verifier.containment)


def _strip(src: str) -> tuple[str, list[int]]:
    """Phases 2-3: splices joined, comments replaced by one space, literals kept verbatim;
    the text and, per character, its 0-based raw line (for hoisting and messages)."""
    out: list[str] = []
    lines: list[int] = []
    line = i = 0
    n = len(src)
    state = "code"
    raw_end = ""
    while i < n:
        m = _SPLICE.match(src, i) if src[i] == "\\" else None
        if m:  # a splice is invisible everywhere but inside a raw string literal
            if state == "raw":  # kept out of the text: a literal's body holds no directive
                out.append(" " * len(m.group(0)))
                lines.extend([line] * len(m.group(0)))
            line += 1
            i = m.end()
            continue
        c = src[i]
        if state == "code":
            if src.startswith("//", i):
                state = "line_comment"
                i += 2
                continue
            if src.startswith("/*", i):
                state = "block_comment"
                out.append(" ")
                lines.append(line)
                i += 2
                continue
            if c == "R" and i + 1 < n and src[i + 1] == '"' and (
                    i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")
                    or src[max(0, i - 2):i] in ("u8",) or src[i - 1] in "uUL"):
                close = src.find("(", i + 2)
                if close != -1 and close - i - 2 <= 16:
                    raw_end = ")" + src[i + 2:close] + '"'
                    state = "raw"
                    out.append(src[i:close + 1])
                    lines.extend([line] * (close + 1 - i))
                    i = close + 1
                    continue
            if c == '"':
                state = "string"
            elif c == "'" and not _digit_separator(src, i):
                state = "char"
        elif state == "line_comment":
            if c == "\n":
                state = "code"
            else:
                i += 1
                continue
        elif state == "block_comment":
            if src.startswith("*/", i):
                state = "code"
                i += 2
                continue
            if c == "\n":
                line += 1
            i += 1
            continue
        elif state in ("string", "char"):
            if c == "\\" and i + 1 < n:
                out.append(src[i:i + 2])
                lines.extend([line, line])
                i += 2
                continue
            if c == ('"' if state == "string" else "'") or c == "\n":
                state = "code"
        elif state == "raw":
            if src.startswith(raw_end, i):
                out.append(raw_end)
                lines.extend([line] * len(raw_end))
                i += len(raw_end)
                state = "code"
                continue
            out.append(" ")
            lines.append(line)
            line += c == "\n"
            i += 1
            continue
        out.append(c)
        lines.append(line)
        if c == "\n":
            line += 1
        i += 1
    return "".join(out), lines


def _digit_separator(src: str, i: int) -> bool:
    """A `'` inside a pp-number (`1'000`, `0x1'F`), not a character literal."""
    j = i - 1
    while j >= 0 and (src[j].isalnum() or src[j] in "_.'"):
        j -= 1
    word = src[j + 1:i]
    return bool(word) and word[0].isdigit() and i + 1 < len(src) and src[i + 1].isalnum()


def _code_outside_literals(text: str) -> str:
    """`text` with string and character literals blanked (identifiers and punctuators kept)."""
    return re.sub(r'(?:u8|[uUL])?R"([^()\\ ]{0,16})\((?:.|\n)*?\)\1"|"(?:\\.|[^"\\\n])*"|'
                  r"(?<![\w'])'(?:\\.|[^'\\\n])*'", " ", text)


def scan_source(src: str) -> SourceScan:
    """Every directive of `src` as the compiler's preprocessor sees it (module docstring)."""
    scan = SourceScan()
    if _TRIGRAPH.search(src):
        scan.alone.append("a trigraph (??=, ??/, ...): the preprocessor reads it as another "
                          "character under some -std modes")
    # read as under -trigraphs too (-std=c++14 turns them on): a directive either way counts
    text, line_of = _strip(_TRIGRAPH.sub(lambda m: _TRIGRAPHS[m.group(0)[2]], src))
    code = scan.code = _code_outside_literals(text)
    if "%:" in code:
        scan.alone.append("the digraph %: (a # the wrapper's directive rules must not miss)")
    if "##" in code:
        scan.alone.append("token pasting (##) can form _Pragma and other operators")
    for m in _IDENT.finditer(code):
        name = m.group(0)
        if name in _ALONE_IDENTS:
            scan.alone.append(f"{name} reaches past the candidate's own code")
        elif name in _READ_IDENTS:
            scan.reject.append(f"{name} probes files at build time")
        elif name in _ASM_IDENTS:
            scan.reject.append(f"{name} (inline assembly can read files: .incbin)")
    depth = 0
    pos = 0
    for ln in text.split("\n"):
        start, pos = pos, pos + len(ln) + 1
        body = ln.lstrip(" \t\f\v")
        if body.startswith("%:"):  # the digraph of #
            body = "#" + body[2:]
        if not body.startswith("#"):
            continue
        first = line_of[start] if start < len(line_of) else 0
        last = line_of[min(pos - 2, len(line_of) - 1)] if ln else first
        rest = body[1:].strip()
        name = (_IDENT.match(rest).group(0) if _IDENT.match(rest) else
                "" if not rest else "?")
        args = rest[len(name):].strip() if name != "?" else rest
        scan.directives.append(Directive(name, args, first, last))
        _judge(scan, name, args)
        if name in ("if", "ifdef", "ifndef"):
            depth += 1
        elif name == "endif":
            depth -= 1
            if depth < 0:
                scan.alone.append("an #endif without its #if")
    if depth > 0:
        scan.alone.append("an #if without its #endif")
    scan.alone = list(dict.fromkeys(scan.alone))
    scan.reject = list(dict.fromkeys(scan.reject))
    return scan


def _judge(scan: SourceScan, name: str, args: str) -> None:
    if name in ("define", "undef"):
        m = _IDENT.match(args)
        if m:
            scan.macros.append(m.group(0))
        return
    if name == "include":
        m = re.fullmatch(r'(<[^<>"\n]+>|"[^"\n]+")\s*', args)
        if not m:
            scan.reject.append(f"#include {args[:80]!r}: only a literal <header> or \"header\" "
                               "may be included (a macro operand can name any file)")
            return
        path = m.group(1)[1:-1]
        if path.startswith("/") or ".." in path.split("/") or path.startswith("proc/"):
            scan.reject.append(f"#include {m.group(1)}: an absolute path or one with .. reads "
                               "files outside the toolchain's and torch's headers")
            return
        scan.includes.append(m.group(1))
        return
    if name in _READS_FILES:
        scan.reject.append(f"#{name} reads files at build time")
        return
    if name == "pragma":
        words = tuple(_IDENT.findall(args)[:2])
        ok = words[:1] in _PRAGMA_OK or words in _PRAGMA_OK
        if words[:1] == ("omp",) and words[1:] and words[1] in _OMP_STATEFUL:
            ok = False
        if not ok:
            scan.alone.append(f"#pragma {args[:60]} changes state past the candidate's code")
        return
    if name not in _BATCH_OK:
        scan.alone.append(f"#{name} {args[:60]}".rstrip() + " is not neutralised in a batch")


def hoistable_lines(src: str, scan: SourceScan) -> dict[int, str]:
    """Raw line index -> the header operand of each include directive (its other raw lines,
    from splices, map to "")."""
    out: dict[int, str] = {}
    for d in scan.directives:
        if d.name != "include":
            continue
        m = re.fullmatch(r'(<[^<>"\n]+>|"[^"\n]+")\s*', d.text)
        if m:
            out[d.first_line] = m.group(1)
            out.update({i: "" for i in range(d.first_line + 1, d.last_line + 1)})
    return out


_DEFINE_LINE = re.compile(r"^#define ([A-Za-z_]\w*)", re.MULTILINE)


def macro_baseline(cmd: list[str], prefix: str, timeout_s: float = 300.0) -> frozenset[str]:
    """Names of the macros defined after `prefix` (the unit's headers) under compiler `cmd`
    (argv up to the input, which is read from stdin), from the compiler's own `-dM` output."""
    from verifier.build_sandbox import build_argv

    proc = subprocess.run(build_argv([*cmd, "-E", "-dM", "-"]), input=prefix, text=True,
                          capture_output=True, timeout=timeout_s, errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"the compiler could not list the headers' macros: "
                           f"{proc.stderr.strip()[-300:]}")
    return frozenset(_DEFINE_LINE.findall(proc.stdout))


# --- what a build read ---------------------------------------------------------------------------
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


def unallowed_reads(log: list[str], deps: list[Path], allowed: list[str],
                    excluded: list[str], host_compiler: str) -> list[str]:
    """Files a build's compiles read (their `-MD` lists `deps`) outside the allowlist: the
    include folders its commands (`$ ` lines of `log`) pass, except `excluded` (a candidate's
    extra_include_paths), the compilers' folders and toolkits, the host compiler's system
    include folders, and `allowed` (the unit's folder, the PCH). A compile that left no list,
    or whose output was cut (a flood could hide what it read), counts as an unknown read."""
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
    if len(ran) < len(deps) or any(len(ln) >= 200_000 for ln in log):
        return ["(unknown: the compiler left no complete record of what it read)"]
    read = [p for d in ran for p in read_dependencies(str(d))]
    cwd = os.getcwd()
    # nvcc's list also names the units' own `#line` files (`<key>/cuda0`, ks_bindings.cpp),
    # which are no files: nothing was read there
    read = [p for p in read if not (_LINE_NAME.fullmatch(p)
                                    and not os.path.lexists(os.path.join(cwd, p)))]
    return outside(read, roots, cwd)


_LINE_NAME = re.compile(r"[0-9a-f]{8,64}/(cpp|cuda)\d+|ks_bindings\.cpp")
