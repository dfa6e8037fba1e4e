"""The compiler's sandbox and folders reached through links (a checkout under /tmp whose .venv is
a link to a virtualenv elsewhere names torch's headers through the link). The fresh root holds
the folders a command's paths lead to, so the command must name them so too."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from verifier.isolation.build_sandbox import build_argv

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


def _compile(work: Path, code: str, *flags: str) -> subprocess.CompletedProcess[str]:
    """g++ -c in the sandbox on a unit in `work` (the folders around it are not in its root)."""
    work.mkdir(exist_ok=True)
    (work / "unit.cpp").write_text(code)
    cmd = ["g++", "-c", *flags, str(work / "unit.cpp"), "-o", str(work / "unit.o")]
    return subprocess.run(build_argv(cmd), capture_output=True, text=True, timeout=120)


def _venv_through_link(tmp_path: Path) -> Path:
    """tmp_path/checkout/.venv -> tmp_path/venv (include/answer.h); the link's path."""
    (tmp_path / "venv" / "include").mkdir(parents=True)
    (tmp_path / "venv" / "include" / "answer.h").write_text("#define ANSWER 42\n")
    (tmp_path / "checkout").mkdir()
    link = tmp_path / "checkout" / ".venv"
    link.symlink_to(tmp_path / "venv")
    return link


def test_an_include_folder_named_through_a_link_is_found(tmp_path: Path) -> None:
    link = _venv_through_link(tmp_path)
    proc = _compile(tmp_path / "work", '#include "answer.h"\nint f() { return ANSWER; }\n',
                    f"-I{link / 'include'}", "-isystem", str(link / "include"))
    if "no namespaces" in proc.stderr:
        pytest.skip(proc.stderr.strip())
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "work" / "unit.o").stat().st_size > 0


def test_the_link_itself_is_not_in_the_compilers_root(tmp_path: Path) -> None:
    """Why the command names the folders with links followed: the root mounts what a link leads
    to, never the link, so a path through the link that the command does not name (here: in
    the source) is not found though its target folder is mounted."""
    link = _venv_through_link(tmp_path)
    proc = _compile(tmp_path / "work",
                    f'#include "{link}/include/answer.h"\nint f() {{ return ANSWER; }}\n',
                    f"-I{tmp_path / 'venv' / 'include'}")
    if "no namespaces" in proc.stderr:
        pytest.skip(proc.stderr.strip())
    assert proc.returncode != 0 and "answer.h" in proc.stderr, proc.stderr
