"""Cgroups of a SIGKILLed verifier (issue 22): removed, with what is left in them, at the next
verifier start; a live verifier's cgroups are never touched."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from verifier.api import verify_batch
from verifier.isolation.cgroups import kill_cgroup, make_pids_cgroup, pids_cgroup_root
from verifier.isolation.stale_cgroups import reap_stale_cgroups, stale_cgroups
from verifier.protocol import VerifyOptions, VerifyRequest


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_only_our_cgroups_of_dead_owners_are_stale(tmp_path: Path) -> None:
    """Selection on a fake cgroup root (plain directories)."""
    dead = _dead_pid()
    names = [f"ks-sbx-{dead}-3", f"ks-mem-{dead}-0", f"ks-probe-{dead}",
             f"ks-sbx-{os.getpid()}-0", f"ks-mem-{os.getppid()}-2", f"other-{dead}-1",
             "ks-sbx-x-1", f"ks-sbx-{dead}-1-extra"]
    for n in names:
        (tmp_path / n).mkdir()
    (tmp_path / f"ks-sbx-{dead}-9").write_text("a file, not a cgroup")
    assert stale_cgroups([tmp_path, tmp_path / "missing"]) == sorted(
        tmp_path / n for n in names[:3])


@pytest.mark.skipif(pids_cgroup_root() is None, reason="no writable pids cgroup here")
def test_a_dead_verifier_s_cgroup_is_emptied_and_removed_at_the_next_start() -> None:
    """Real cgroups: a process left in a dead owner's cgroup is killed, the cgroup removed by
    `verify_batch`; the cgroup of this (live) process stays."""
    root = pids_cgroup_root()
    assert root is not None
    stale = root / f"ks-sbx-{_dead_pid()}-0"
    stale.mkdir()
    leftover = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    mine = make_pids_cgroup(64)
    assert mine is not None
    try:
        (stale / "cgroup.procs").write_text(str(leftover.pid))
        assert str(leftover.pid) in (stale / "cgroup.procs").read_text().split()
        stats: dict = {}
        (v,) = verify_batch([VerifyRequest("c", "t", "x = 1\n", "no code here", "cpu")],
                            VerifyOptions(backend="cpu", fork_server=False), stats=stats)
        assert v.status == "format_error"
        assert stats["counters"]["stale_cgroups_removed"] >= 1
        assert leftover.wait(timeout=20) == -9
        assert not stale.exists() and mine.exists()
        reap_stale_cgroups([root])  # again, as a later verifier start would
        assert mine.exists()
    finally:
        leftover.kill()
        leftover.wait()
        kill_cgroup(mine)
        if stale.exists():
            kill_cgroup(stale)
