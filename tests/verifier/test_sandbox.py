"""The sandbox: crashes, timeouts, floods and fork bombs end only the child, leaving nothing."""

from __future__ import annotations

import os
import sys
import time

import pytest

from verifier.sandbox import SandboxLimits, pids_cgroup_root, run_sandboxed


def _py(code: str, **limits) -> object:
    return run_sandboxed([sys.executable, "-c", code], limits=SandboxLimits(**limits))


def _alive_with(marker: str) -> list[int]:
    pids = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/cmdline", "rb") as fh:
                    if marker.encode() in fh.read():
                        pids.append(int(p))
            except OSError:
                pass
    return pids


def test_result_json_round_trip() -> None:
    res = _py("import json; open('result.json','w').write(json.dumps({'a': 1}))")
    assert res.payload == {"a": 1} and res.returncode == 0


def test_segfault_is_reported_as_signal() -> None:
    res = _py("import ctypes; ctypes.string_at(0)")
    assert res.payload is None and res.signal_name == "SIGSEGV"
    assert "segmentation fault" in res.describe_failure()


def test_timeout_kills_the_child() -> None:
    t0 = time.monotonic()
    res = _py("while True: pass", timeout_s=2)
    assert res.timed_out and time.monotonic() - t0 < 10


def test_stdout_flood_is_capped() -> None:
    res = _py("import sys\nb = 'x' * (1 << 20)\nfor _ in range(1024): sys.stdout.write(b)",
              timeout_s=30, file_mb=16)
    assert res.payload is None
    assert res.signal_name == "SIGXFSZ" or res.returncode != 0
    assert len(res.stdout) < 300_000


def test_environment_is_scrubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "secret-token")
    res = _py("import os, json; open('result.json','w').write(json.dumps(dict(os.environ)))")
    assert "HF_TOKEN" not in res.payload


def test_fork_bomb_is_contained_and_cleaned_up() -> None:
    marker = f"ksbomb{os.getpid()}{time.monotonic_ns()}"
    # Children setsid() to escape the process group, then fork forever.
    code = (f"import os\nMARK = '{marker}'\nwhile True:\n    try:\n        if os.fork() == 0:\n"
            "            os.setsid()\n    except OSError:\n        pass\n")
    t0 = time.monotonic()
    res = _py(code, timeout_s=4, processes=64)
    assert res.timed_out and time.monotonic() - t0 < 30
    time.sleep(0.5)
    assert _alive_with(marker) == []
    if pids_cgroup_root() is not None:
        assert res.extra["pids_cgroup"] and res.extra["leftover_killed"] > 0
