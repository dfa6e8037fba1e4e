"""A failed build is cached under its spec's key only when its cause is the spec's own text
(verifier.compile.build_cause): a compiler killed by a signal, a timeout, a missing precompiled
header or toolchain file, a sandbox that cannot start are not, and the next build of the same
sources succeeds (issue 28: an honest candidate's verdict never depends on what ran before it).
Real compiles, in a build cache under tmp_path."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from verifier.backends import get_backend
from verifier.checks.extspec import ExtensionSpec
from verifier.compile.build_cause import environment_cause
from verifier.compile.build_reads import UNKNOWN_READ
from verifier.compile.builder import REFUSED, BuildContext, Builder, BuildResult
from verifier.isolation.build_sandbox import BuildSandboxError

pytestmark = pytest.mark.heavy  # out of the default run: CI runs it (-m heavy)

HONEST = ExtensionSpec("e", ["int twice(int x) { return 2 * x; }"], functions=["twice"])


def _builder(cache: Path, **kw) -> Builder:
    return Builder(BuildContext(get_backend("cpu"), cache, check_import=False, **kw))


def _index(b: Builder, spec: ExtensionSpec) -> Path:
    return b.root / "index" / f"{spec.key}.json"


def _descendants_named(name: str) -> list[int]:
    """Pids of this process's descendants whose command is `name` (the compilers it runs)."""
    parent: dict[int, int] = {}
    comm: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        close = stat.rindex(")")
        comm[int(entry)] = stat[stat.index("(") + 1:close]
        parent[int(entry)] = int(stat[close + 2:].split()[1])
    me, found = os.getpid(), []
    for pid, what in comm.items():
        up = parent.get(pid, 0)
        while up and up != me:
            up = parent.get(up, 0)
        if what == name and up == me:
            found.append(pid)
    return found


@contextlib.contextmanager
def _compilers_killed(name: str = "cc1plus") -> Iterator[list[int]]:
    """While inside, every `name` this process starts is killed with SIGKILL (as the kernel's
    OOM killer ends a compiler on a host short of memory); yields the pids killed."""
    killed: list[int] = []
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(0.02):
            for pid in _descendants_named(name):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield killed
    finally:
        stop.set()
        t.join()


def test_a_compiler_killed_by_a_signal_is_not_cached_and_the_next_build_succeeds(
        tmp_path: Path) -> None:
    b = _builder(tmp_path)
    with _compilers_killed() as killed:
        res = b.build([HONEST])[HONEST.key]
    assert killed, "no compiler was seen to kill"
    assert not res.ok and "Killed signal" in res.log, res.log[-2000:]
    assert res.environmental and not _index(b, HONEST).exists()
    again = _builder(tmp_path).build([HONEST])[HONEST.key]
    assert again.ok and not again.cached, again.log[-2000:]
    assert json.loads(_index(b, HONEST).read_text())["ok"] is True


def test_a_compile_that_timed_out_is_not_cached_and_the_next_build_succeeds(
        tmp_path: Path) -> None:
    res = _builder(tmp_path, timeout_s=0.3).build([HONEST])[HONEST.key]
    assert not res.ok and "timed out" in res.log, res.log[-2000:]
    b = _builder(tmp_path)
    assert not _index(b, HONEST).exists() and b.cached(HONEST) is None
    again = b.build([HONEST])[HONEST.key]
    assert again.ok and not again.cached, again.log[-2000:]


def test_a_syntax_error_in_the_candidate_is_cached(tmp_path: Path) -> None:
    bad = ExtensionSpec("e", ["int twice(int x) { return 2 * x }"], functions=["twice"])
    first = _builder(tmp_path).build([bad])[bad.key]
    assert not first.ok and not first.cached
    assert "cpp_sources[0]:1:" in first.log and "error" in first.log, first.log[-2000:]
    assert first.environmental == ""
    second = _builder(tmp_path).build([bad])[bad.key]
    assert not second.ok and second.cached and second.log == first.log


def test_a_missing_precompiled_header_is_not_cached(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The PCH folder another process trimmed while this build used it: gcc cannot find
    ks_pch.h; the honest spec's next build (no PCH for one spec) succeeds."""
    gone = tmp_path / "trimmed-pch"
    gone.mkdir()

    @contextlib.contextmanager
    def trimmed(*args, **kwargs) -> Iterator[Path]:
        yield gone

    monkeypatch.setattr(Builder, "held_pch", trimmed)
    res = _builder(tmp_path / "cache").build([HONEST])[HONEST.key]
    assert not res.ok and "ks_pch.h" in res.log, res.log[-2000:]
    assert "No such file or directory" in res.environmental
    monkeypatch.undo()
    b = _builder(tmp_path / "cache")
    assert b.cached(HONEST) is None
    again = b.build([HONEST])[HONEST.key]
    assert again.ok and not again.cached, again.log[-2000:]


def test_a_missing_compiler_fails_the_build_without_a_cached_outcome(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The toolchain's compiler is gone: the sandbox cannot start it; nothing is cached."""
    b = _builder(tmp_path)
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    with pytest.raises(BuildSandboxError):
        b.build([HONEST])
    assert not list((b.root / "index").glob("*.json"))


def test_an_environmental_failure_cached_by_an_older_verifier_is_built_again(
        tmp_path: Path) -> None:
    b = _builder(tmp_path)
    old = {"key": HONEST.key, "ok": False, "log": "compiler timed out after 600s",
           "unit_log": True}
    _index(b, HONEST).write_text(json.dumps(old))
    assert b.cached(HONEST) is None
    own = {**old, "log": "cpp_sources[0]:1:32: error: expected ';' before '}' token"}
    _index(b, HONEST).write_text(json.dumps(own))
    hit = b.cached(HONEST)
    assert hit is not None and hit.cached and not hit.ok


@pytest.mark.parametrize("log", [
    "cpp_sources[0]:3:5: error: 'y' was not declared in this scope",
    "cuda_sources[1]:12:1: error: identifier \"q\" is undefined",
    "cpp_sources[0]:2:2: error: #error no",
    "import of the built extension failed: ImportError: ks_mx.so: undefined symbol: _Z1fv",
    "import of the built extension failed: it calls a library's compute by name: sgemm_",
])
def test_the_candidate_s_own_failures(log: str) -> None:
    assert environment_cause(log) == ""
    assert BuildResult("k", False, log=log).environmental == ""


@pytest.mark.parametrize("log", [
    "g++: fatal error: Killed signal terminated program cc1plus\ncompilation terminated.",
    "compiler killed by signal 9",
    "cuda_sources[0]:3:1: error: x\nnvcc error   : 'cudafe++' died due to signal 9 (Kill signal)",
    "compiler timed out after 600s",
    "<command-line>: fatal error: ks_pch.h: No such file or directory",
    "cpp_sources[0]:1:10: fatal error: torch/extension.h: No such file or directory",
    "cpp_sources[0]:4:1: error: x\n{standard input}: Fatal error: can't write 12 bytes to "
    "section .text of host.o: 'No space left on device'",
    "cpp_sources[0]:9:1: internal compiler error: Segmentation fault",
    "g++: fatal error: cannot execute 'cc1plus': execvp: No such file or directory",
    "cc1plus: out of memory allocating 65536 bytes",
    "import of the built extension failed: worker died with SIGKILL (killed (memory or CPU "
    "limit))",
    "import of the built extension failed: libc10.so: cannot open shared object file",
    "static initializers misbehave: its import took 14 s",
    "/usr/bin/ld: final link failed: Input/output error",
    "",
    "some output that names no line of the spec",
])
def test_failures_the_environment_caused(log: str) -> None:
    assert environment_cause(log) != ""
    assert BuildResult("k", False, log=log).environmental != ""


def test_refusals_are_the_candidate_s_unless_the_reads_are_unknown() -> None:
    assert BuildResult("k", False, log=f"{REFUSED} it read /etc/passwd").environmental == ""
    assert BuildResult("k", False, log=f"{REFUSED} it read {UNKNOWN_READ}").environmental
    assert BuildResult("k", True, log="compiler timed out").environmental == ""
