"""What a build may read: nvcc's host compiler's own headers count as the toolchain's.

On a toolkit image (CXX=/opt/gcc/bin/g++, g++ 13 on PATH) every CUDA build was refused for
reading g++ 13's <stddef.h>: the allowlist held the host units' compiler's folders only, while
nvcc ran the g++ on PATH. The allowlist now holds the folders of the compiler
each nvcc line runs (its `-ccbin`, else g++ on PATH).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from verifier.compile.build_reads import (
    UNKNOWN_READ,
    compiler_search_dirs,
    nvcc_host_compiler,
    unallowed_reads,
)

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


def test_nvcc_host_compiler_reads_every_spelling() -> None:
    assert nvcc_host_compiler(["nvcc", "-ccbin", "/opt/gcc/bin/g++", "-c", "a.cu"]) == \
        "/opt/gcc/bin/g++"
    assert nvcc_host_compiler(["nvcc", "--compiler-bindir=/x/g++", "-c", "a.cu"]) == "/x/g++"
    assert nvcc_host_compiler(["nvcc", "-ccbin=clang++", "-c", "a.cu"]) == "clang++"
    assert nvcc_host_compiler(["nvcc", "-c", "a.cu"]) == "g++"


def test_a_missing_compiler_adds_no_folder() -> None:
    assert compiler_search_dirs("/nonexistent/bin/g++") == []


def _stddef() -> str:
    """The real <stddef.h> the g++ on PATH reads (its own folder, not /usr/include)."""
    for d in compiler_search_dirs("g++"):
        if (Path(d) / "stddef.h").is_file():
            return str(Path(d) / "stddef.h")
    pytest.skip("g++ lists no folder with its own stddef.h")


@needs_gxx
def test_nvcc_hosts_headers_are_the_toolchains(tmp_path: Path) -> None:
    dep = tmp_path / "unit.d"
    dep.write_text(f"unit.o: {tmp_path / 'unit.cu'} \\\n {_stddef()}\n")
    (tmp_path / "unit.cu").write_text("")
    log = [f"$ nvcc -ccbin g++ -c {tmp_path / 'unit.cu'} -o unit.o"]
    # the host units' compiler is another one (absent here): nvcc's host g++ still counts
    assert unallowed_reads(log, [dep], [str(tmp_path)], [], "/nonexistent/bin/c++") == []


@needs_gxx
def test_a_host_file_is_still_refused_beside_them(tmp_path: Path) -> None:
    secret = tmp_path / "home" / "secret.h"
    secret.parent.mkdir()
    secret.write_text("#define KEY 1\n")
    dep = tmp_path / "unit.d"
    dep.write_text(f"unit.o: {tmp_path / 'out'} {_stddef()} {secret}\n")
    (tmp_path / "out").mkdir()
    log = ["$ nvcc -c unit.cu -o unit.o"]
    assert unallowed_reads(log, [dep], [str(tmp_path / "out")], [], "g++") == [str(secret)]



@needs_gxx
def test_the_units_own_line_names_are_not_reads(tmp_path: Path) -> None:
    """nvcc's `-MD` list names the `#line` files of a unit's sources: no file, nothing read
    (every CUDA build on an H100 was refused for reading `candidate.py` before)."""
    dep = tmp_path / "unit.d"
    dep.write_text(f"unit.o: {tmp_path / 'unit.cu'} 0123456789abcdef/cuda0 "
                   f"0123456789abcdef/cpp1 ks_bindings.cpp {_stddef()}\n")
    (tmp_path / "unit.cu").write_text("")
    log = ["$ nvcc -c unit.cu -o unit.o"]
    assert unallowed_reads(log, [dep], [str(tmp_path)], [], "g++") == []
    # a real file under such a name is a read like any other
    planted = tmp_path / "0123456789abcdef"
    planted.mkdir()
    (planted / "cuda0").write_text("secret")
    cwd = Path.cwd()
    try:
        os.chdir(tmp_path)
        dep.write_text("unit.o: 0123456789abcdef/cuda0\n")
        assert unallowed_reads(log, [dep], [str(tmp_path / "out")], [], "g++") == \
            ["0123456789abcdef/cuda0"]
    finally:
        os.chdir(cwd)


@needs_gxx
def test_a_header_the_candidate_names_that_does_not_exist_is_the_compilers_error(
        tmp_path: Path) -> None:
    """A real g++ on `#include <cublas_v2.h>` where there is none writes no `-MD` list: the
    build is the compiler's error (the header named), not an unknown read; a compile that
    left no list for any other reason still is one."""
    out = tmp_path / "out"
    out.mkdir()
    src = out / "unit.cpp"
    src.write_text("#include <ks_no_such_header_v2.h>\nint x;\n")
    dep = out / "unit.d"
    proc = subprocess.run(["g++", "-c", str(src), "-MD", "-MF", str(dep), "-o",
                           str(out / "unit.o")], capture_output=True, text=True)
    assert proc.returncode != 0 and not dep.exists(), proc.stderr
    log = [f"$ g++ -c {src} -MD -MF {dep} -o {out / 'unit.o'}", proc.stderr]
    assert unallowed_reads(log, [dep], [str(out)], [], "g++") == []
    # the same error from a file outside the unit's folder proves nothing about the unit
    elsewhere = tmp_path / "elsewhere.h"
    moved = [log[0], proc.stderr.replace(str(src), str(elsewhere))]
    assert unallowed_reads(moved, [dep], [str(out)], [], "g++") == [
        "(unknown: the compiler left no complete record of what it read)"]
    # and a compile that died without a word is unknown too
    assert unallowed_reads(log[:1], [dep], [str(out)], [], "g++") == [
        "(unknown: the compiler left no complete record of what it read)"]
    # unless the build failed: then the compiler's words are its error (they can quote only
    # what its sandbox shows it), but a cut output still proves nothing
    assert unallowed_reads(moved, [dep], [str(out)], [], "g++", failed=True) == []
    assert unallowed_reads([log[0], "x" * 200_000], [dep], [str(out)], [], "g++",
                           failed=True) == [UNKNOWN_READ]


@needs_gxx
def test_a_build_that_fails_with_no_dependency_list_reports_the_compilers_error(
        tmp_path: Path) -> None:
    """A real build whose compile stops at a file its flags name before any source (as a
    precompiled header removed under it did: `-include ks_pch.h`) writes no -MD list. Before:
    the build read "the compiler left no complete record of what it read"; now the build
    fails with the compiler's own error, the file named."""
    from verifier.backends import get_backend
    from verifier.checks.extspec import ExtensionSpec
    from verifier.compile.builder import REFUSED, BuildContext, Builder

    builder = Builder(BuildContext(get_backend("cpu"), tmp_path, use_pch=False,
                                   check_import=False))
    spec = ExtensionSpec("gone", ["int gone_f() { return 1; }"], functions=["gone_f"],
                         extra_cflags=["-include", "ks_pch_gone.h"])
    (res,) = builder.build([spec]).values()
    assert not res.ok
    assert "ks_pch_gone.h: No such file or directory" in res.log, res.log[-2000:]
    assert REFUSED not in res.log and "no complete record" not in res.log, res.log[-2000:]
