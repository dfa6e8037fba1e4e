"""scripts/setup.sh shows pip's output and stops, with pip's status, when an install fails."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A stand-in interpreter in the copy's .venv: logs its arguments, prints progress lines like
# pip's, and fails the install named in FAIL_ON with exit status 7.
FAKE_PYTHON = """#!/usr/bin/env bash
echo "$*" >> "$(dirname "$0")/../calls.log"
if [ "$1 $2 $3" = "-m pip install" ]; then
  echo "Collecting ${@: -1}"
  echo "WARNING: Location noise that setup filters"
  if [ -n "${FAIL_ON:-}" ] && [[ "$*" == *"$FAIL_ON"* ]]; then
    echo "ERROR: No matching distribution found for ${@: -1}" >&2
    exit 7
  fi
  sleep "${FAKE_PIP_S:-0}"
  echo "Successfully installed ${@: -1}"
fi
exit 0
"""


def _copy(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    return tmp_path


def _run(root: Path, fail_on: str = "", **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(root / "scripts" / "setup.sh")], capture_output=True,
                          text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "FAIL_ON": fail_on, **env})


def test_setup_shows_progress_and_installs_torch_first(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    start = time.monotonic()
    res = _run(root)
    assert time.monotonic() - start < 20  # nothing (the 30 s heartbeat) keeps the output open
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Collecting torch==2.13.0" in res.stdout and "Successfully installed .[dev]" in res.stdout
    assert "==> installing torch 2.13.0 (CPU build)" in res.stdout and "==> done" in res.stdout
    assert "WARNING: Location" not in res.stdout + res.stderr
    calls = (root / ".venv" / "calls.log").read_text().splitlines()
    assert calls[0].endswith("install --disable-pip-version-check --progress-bar off "
                             "torch==2.13.0")
    assert "-q" not in calls[0].split() and calls[1].endswith("-e .[dev]")


def test_a_failed_install_stops_setup_with_its_status(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    res = _run(root, fail_on="torch==")
    assert res.returncode == 7, res.stdout + res.stderr
    assert "ERROR: No matching distribution found for torch==2.13.0" in res.stdout
    assert "setup: 'pip install torch==2.13.0' failed with exit status 7" in res.stderr
    calls = (root / ".venv" / "calls.log").read_text().splitlines()
    assert len(calls) == 1  # nothing ran after the failed step
    res = _run(root, fail_on=".[dev]")
    assert res.returncode == 7 and "installing kernelsynth" in res.stdout
    assert "checking the packages import" not in res.stdout


def test_a_long_install_prints_a_heartbeat_that_stops_with_it(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    res = _run(root, SETUP_HEARTBEAT_S="1", FAKE_PIP_S="2.5")
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    torch_at, dev_at = (lines.index(f"Successfully installed {p}") for p in ("torch==2.13.0",
                                                                            ".[dev]"))
    beats = [i for i, ln in enumerate(lines) if ln.startswith("    ... pip still working (")]
    assert any(i < torch_at for i in beats) and any(torch_at < i < dev_at for i in beats), lines
    # once pip is done its heartbeat is gone: none after the last install
    assert max(beats) < dev_at, lines
