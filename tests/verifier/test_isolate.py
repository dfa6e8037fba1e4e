"""verifier.isolate in a forked child: the run's own unprivileged uid, no capabilities, host
control files (cgroups) unwritable, its own pid namespace."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from verifier.isolate import RUN_UID_BASE, isolate, run_uid


def _in_isolated_child(workdir: Path, uid: int, probe) -> dict:
    """Fork, isolate, run `probe()` (a dict) and return it through a pipe."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(rfd)
            cwd, note = isolate(str(workdir), 16, True, uid)
            os.chdir(cwd)
            out = {"note": note, **probe()}
        except BaseException as exc:  # reported to the test, which fails on it
            out = {"error": f"{type(exc).__name__}: {exc}"}
        os.write(wfd, json.dumps(out).encode())
        os._exit(0)
    os.close(wfd)
    data = b""
    while chunk := os.read(rfd, 65536):
        data += chunk
    os.close(rfd)
    os.waitpid(pid, 0)
    return json.loads(data)


def _probe() -> dict:
    status = Path("/proc/self/status").read_text().splitlines()
    cap = [ln.split()[1] for ln in status if ln.startswith("CapEff")][0]
    written = []
    for cg in ("/sys/fs/cgroup/pids/cgroup.procs", "/sys/fs/cgroup/cgroup.procs"):
        try:
            with open(cg, "w") as fh:
                fh.write(str(os.getpid()))
            written.append(cg)
        except OSError:
            pass
    return {"resuid": list(os.getresuid()), "resgid": list(os.getresgid()), "cap": cap,
            "groups": os.getgroups(), "pid": os.getpid(), "cgroup_written": written,
            "cwd": os.getcwd()}


def test_run_uid_is_unprivileged_and_distinct() -> None:
    assert run_uid(0) == RUN_UID_BASE and run_uid(1) != run_uid(0) and run_uid(5) > 65535


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid drop is taken when the verifier is root")
def test_child_drops_to_the_runs_uid(tmp_path: Path) -> None:
    uid = run_uid(4242)
    r = _in_isolated_child(tmp_path, uid, _probe)
    assert "error" not in r, r
    assert r["resuid"] == [uid] * 3 and r["resgid"] == [uid] * 3 and r["groups"] == []
    assert int(r["cap"], 16) == 0
    assert r["pid"] == 1 and r["cwd"] == "/tmp/run"
    assert r["cgroup_written"] == []  # cgroup_escape: the host's cgroup files stay closed


def test_unprivileged_caller_gets_no_escape(tmp_path: Path) -> None:
    r = _in_isolated_child(tmp_path, run_uid(7), _probe)
    assert "error" not in r, r
    assert r["cgroup_written"] == []
