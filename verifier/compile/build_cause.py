"""Whose doing a failed build is: a failure is cached under its spec's key only when its cause is
in the spec's own text, so an honest candidate's verdict never depends on what the host was doing
when it was first built (issue 28).

A failure is the spec's own when the build refused what the spec reads or passes (a static
refusal), when the compiler's diagnostics name an error at the spec's own source lines, or when
the built object's import failed on what the object is (an undefined symbol, a library called by
name, static initializers that misbehave in a way load cannot cause). Anything else, and anything
that names the environment anywhere in its log (a compiler killed by a signal or the kernel's
OOM killer, a timeout, a missing or unreadable toolchain or precompiled-header file, a full disk,
the sandbox failing to start) is built again the next time: at worst a candidate's own failure
costs one more compile, never another candidate its verdict.
"""

from __future__ import annotations

import re

from verifier.compile.build_reads import UNKNOWN_READ

# a diagnostic at the spec's own lines, as `Builder._spec_log` names them (gcc's form; the cuda
# backend rewrites nvcc's `file(12): error` to it)
OWN_ERROR = re.compile(r"^(?:cpp|cuda)_sources\[\d+\]:\d+:\d+: (?:fatal )?error\b", re.M)
# the load check's lines (`verifier.compile.object_import`): the first's words are the
# interpreter's or the sandbox's (before the object loaded) or the sandbox's own description of
# how the child ended; after OBJECT_SAID come the words of a process the object's static
# initializers shared: the spec's own, whatever they name (an initializer that prints
# "No space left on device" and exits: tests/verifier/test_redteam_round11.py)
IMPORT_FAILED = "import of the built extension failed: "
OBJECT_SAID = "import of the built extension failed, in the words of its process: "
# what the object is, found when it was imported (`verifier.compile.loadcheck`)
OWN_IMPORT = re.compile(r"undefined symbol|calls a library's compute by name|"
                        r"static initializers misbehave|" + re.escape(OBJECT_SAID))
ENVIRONMENT = re.compile(
    r"timed out|killed by signal|Killed signal|signal terminated program|died due to signal|"
    r"internal compiler error|No such file or directory|cannot open shared object|No space left on device|"
    r"Disk quota exceeded|Cannot allocate memory|out of memory|memory exhausted|"
    r"std::bad_alloc|cannot run |cannot execute|Input/output error|Too many open files|"
    r"Resource temporarily unavailable|Permission denied|Read-only file system|"
    r"Segmentation fault|Bus error|ks_pch|\.gch\b|precompiled header|\[build sandbox\]|"
    r"^build error:|worker died|worker exited|its import took", re.I | re.M)
# A diagnostic at the spec's own lines quotes the spec's text (an `#error`, a static_assert's
# message, its names): there only the compiler's own words name the environment (a crash of
# the compiler, an include not found); a name an import failed on is the spec's too. Else a
# candidate writes `#error No space left on device` and its failure is never cached (built
# again on every request) and blamed on the host (tests/verifier/test_redteam_round11.py).
OWN_LINE = re.compile(r"^(?:cpp|cuda)_sources\[\d+\][:(]")
OWN_LINE_ENVIRONMENT = re.compile(
    r"^(?:cpp|cuda)_sources\[\d+\][:(][\d:)]*\s*(?:internal compiler error|fatal error: [^:\s]+: "
    r"(?:No such file or directory|Permission denied|Input/output error|Too many open files|"
    r"Cannot allocate memory|No space left on device))")  # an include the host failed to read
SYMBOL = re.compile(r"(undefined symbol: )\S+")


def environment_cause(log: str, refused: bool = False) -> str:
    """Why a failed build with this log (its spec's part, `Builder._spec_log`) is not its spec's
    own doing (the first line that names the environment, or that no line names the spec's
    text); "" when it is (a refusal, an error at its own lines, an import that failed on what
    the object is)."""
    if refused:  # the builder's own words (no compiler output), unless it could not tell
        return "" if UNKNOWN_READ not in log else UNKNOWN_READ
    for line in log.splitlines():
        if OWN_LINE.match(line) and not OWN_LINE_ENVIRONMENT.match(line):
            continue  # the spec's own text
        if line.startswith(OBJECT_SAID):
            continue  # its static initializers' words
        if ENVIRONMENT.search(SYMBOL.sub(r"\1", line)):
            return line.strip()[:300]
    if OWN_ERROR.search(log) or OWN_IMPORT.search(log):
        return ""
    return "no error at the spec's own lines"
