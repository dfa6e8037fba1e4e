"""What the preprocessor will see in a candidate's C++/CUDA source, as the compiler sees it.

`scan_source` runs translation phases 1-3 itself (trigraphs, line splices with trailing blanks,
comments, string and raw-string literals, digraphs) and lists every directive in the text: the
macros it defines or undefines, the headers it includes (with the raw lines that hold them, for
hoisting), and the reasons it cannot share a translation unit with other candidates (`alone`:
built as a unit of its own, where nothing of it can reach another candidate) or cannot be built
at all (`reject`: it reads files the build must not see). A batch unit (`verifier.compile.builder`) holds
a source only when its scan has no `alone` reason, and restores every macro it touched after it.
`macro_baseline` asks the compiler which macros exist before the candidates' code (`-dM`), so
a candidate that redefines or undefines one of them (a header's or a predefined macro, which an
`#undef` cannot restore) is built alone too.
"""

from __future__ import annotations

import functools
import re
import subprocess
from dataclasses import dataclass, field

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
    code: str = ""  # the text after phase 3 with its literals blanked (verifier.compile.containment)


def _strip(src: str) -> tuple[str, list[int]]:
    """Phases 2-3: splices joined, comments replaced by one space, literals kept verbatim;
    the text and, per character, its 0-based raw line (for hoisting and messages)."""
    return _Stripper(src).run()


class _Stripper:
    """`_strip`'s scanner: one state (code, a comment, a string, char or raw literal) and a
    step for each; a step that consumed its text itself returns True."""

    def __init__(self, src: str) -> None:
        self.src, self.n = src, len(src)
        self.out: list[str] = []
        self.lines: list[int] = []
        self.line = self.i = 0
        self.state = "code"
        self.raw_end = ""
        self.steps = {"code": self._code, "line_comment": self._line_comment,
                      "block_comment": self._block_comment, "string": self._literal,
                      "char": self._literal, "raw": self._raw}

    def emit(self, text: str) -> None:
        self.out.append(text)
        self.lines.extend([self.line] * len(text))

    def run(self) -> tuple[str, list[int]]:
        while self.i < self.n:
            if self.src[self.i] == "\\" and self._splice():
                continue
            c = self.src[self.i]
            if self.steps[self.state](c):
                continue
            self.emit(c)
            if c == "\n":
                self.line += 1
            self.i += 1
        return "".join(self.out), self.lines

    def _splice(self) -> bool:
        m = _SPLICE.match(self.src, self.i)
        if not m:
            return False
        if self.state == "raw":  # a splice is invisible everywhere but inside a raw literal,
            self.emit(" " * len(m.group(0)))  # kept out of the text: it holds no directive
        self.line += 1
        self.i = m.end()
        return True

    def _code(self, c: str) -> bool:
        src, i = self.src, self.i
        if src.startswith("//", i):
            self.state = "line_comment"
            self.i += 2
            return True
        if src.startswith("/*", i):
            self.state = "block_comment"
            self.emit(" ")
            self.i += 2
            return True
        if c == "R" and self._raw_start():
            return True
        if c == '"':
            self.state = "string"
        elif c == "'" and not _digit_separator(src, i):
            self.state = "char"
        return False

    def _raw_start(self) -> bool:
        src, i = self.src, self.i
        if not (i + 1 < self.n and src[i + 1] == '"' and (
                i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")
                or src[max(0, i - 2):i] in ("u8",) or src[i - 1] in "uUL")):
            return False
        close = src.find("(", i + 2)
        if close == -1 or close - i - 2 > 16:
            return False
        self.raw_end = ")" + src[i + 2:close] + '"'
        self.state = "raw"
        self.emit(src[i:close + 1])
        self.i = close + 1
        return True

    def _line_comment(self, c: str) -> bool:
        if c == "\n":
            self.state = "code"
            return False
        self.i += 1
        return True

    def _block_comment(self, c: str) -> bool:
        if self.src.startswith("*/", self.i):
            self.state = "code"
            self.i += 2
            return True
        if c == "\n":
            self.line += 1
        self.i += 1
        return True

    def _literal(self, c: str) -> bool:
        if c == "\\" and self.i + 1 < self.n:
            self.emit(self.src[self.i:self.i + 2])
            self.i += 2
            return True
        if c == ('"' if self.state == "string" else "'") or c == "\n":
            self.state = "code"
        return False

    def _raw(self, c: str) -> bool:
        if self.src.startswith(self.raw_end, self.i):
            self.emit(self.raw_end)
            self.i += len(self.raw_end)
            self.state = "code"
            return True
        self.emit(" ")
        self.line += c == "\n"
        self.i += 1
        return True


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
    from verifier.backends.tool_load import TOOL_LOAD
    from verifier.isolation.build_sandbox import build_argv

    with TOOL_LOAD.running():  # a compiler on the host's cores (`verifier.run.baselines`)
        proc = subprocess.run(build_argv([*cmd, "-E", "-dM", "-"]), input=prefix, text=True,
                              capture_output=True, timeout=timeout_s, errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"the compiler could not list the headers' macros: "
                           f"{proc.stderr.strip()[-300:]}")
    return frozenset(_DEFINE_LINE.findall(proc.stdout))


# --- what a build read ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def scan(src: str) -> SourceScan:
    """`scan_source`, once per source text."""
    return scan_source(src)
