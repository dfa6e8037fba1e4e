"""The fork server: forked children get the whole sandbox, and a bad child ends only itself."""

from __future__ import annotations

import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from verifier.isolation.cgroups import pids_cgroup_root
from verifier.isolation.sandbox import SandboxLimits
from verifier.run.forkserver import _PKG_ROOT, ForkServer

# An entry module that runs the code.py of its working directory (tests only), as the
# verifier's own entries do: the started byte written and its pipe closed before the code runs
# (`verifier.isolation.started.reach_candidate`)
ENTRY = ("import runpy\nfrom verifier.isolation.started import reach_candidate\n"
         "reach_candidate()\nrunpy.run_path('code.py', run_name='__main__')\n")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("entry")
    (root / "ks_test_entry.py").write_text(ENTRY)
    os.chmod(root, 0o755)  # children run as an unprivileged user (verifier.isolation.isolate)
    srv = ForkServer(preload=("verifier.run.worker",),
                     env={"PYTHONPATH": f"{_PKG_ROOT}{os.pathsep}{root}"})
    srv.start()
    yield srv
    srv.close()


def _run(server: ForkServer, code: str, **limits):
    return server.run_module("ks_test_entry", limits=SandboxLimits(**limits),
                             input_files={"code.py": code})


def test_result_and_the_server_reports_torch(server: ForkServer) -> None:
    res = _run(server, "import json, torch\n"
                       "open('result.json', 'w').write(json.dumps({'v': torch.__version__}))")
    assert res.payload == {"v": server.info["torch"]} and res.returncode == 0
    assert res.extra["forked"] and server.info["preloaded"] == ["verifier.run.worker"]


def test_crash_signal_and_exit_code(server: ForkServer) -> None:
    res = _run(server, "import ctypes; ctypes.string_at(0)")
    assert res.payload is None and res.signal_name == "SIGSEGV"
    assert "segmentation fault" in res.describe_failure()
    res = _run(server, "raise ValueError('boom from the candidate')")
    assert res.returncode == 1 and "boom from the candidate" in res.stderr


def test_timeout_kills_only_that_child(server: ForkServer) -> None:
    t0 = time.monotonic()
    res = _run(server, "while True: pass", timeout_s=1.5)
    assert res.timed_out and res.payload is None and time.monotonic() - t0 < 15
    ok = _run(server, "open('result.json', 'w').write('{}')")  # the server goes on
    assert ok.payload == {}


def test_children_run_concurrently(server: ForkServer) -> None:
    """Three children that sleep 1.5 s each were all alive at one moment (their own clocks,
    not the batch's wall time: a loaded host's forks may take seconds, run in turns they
    never overlap)."""
    code = ("import time, json\nt = time.time()\ntime.sleep(1.5)\n"
            "open('result.json', 'w').write(json.dumps([t, time.time()]))")
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda _: _run(server, code), range(3)))
    assert all(isinstance(r.payload, list) for r in results), [r.stderr for r in results]
    spans = [r.payload for r in results]
    assert max(s for s, _ in spans) < min(e for _, e in spans), spans  # one moment in all


def test_environment_fds_and_files(server: ForkServer, monkeypatch: pytest.MonkeyPatch) -> None:
    code = ("import os, json\n"
            "fds = {}\n"
            "for f in os.listdir('/proc/self/fd'):\n"
            "    try:\n"
            "        fds[f] = os.readlink(f'/proc/self/fd/{f}')\n"
            "    except OSError:\n"
            "        pass  # the listing's own handle, closed by now\n"
            "data = {'env': dict(os.environ), 'fds': fds, 'sid': os.getsid(0) == os.getpid()}\n"
            "open('result.json', 'w').write(json.dumps(data))")
    monkeypatch.setenv("HF_TOKEN", "secret-token")
    res = server.run_module("ks_test_entry", input_files={"code.py": code},
                            env={"KS_MARK": "1"})
    env = res.payload["env"]
    assert "HF_TOKEN" not in env and env["KS_MARK"] == "1"
    # none of the server's pipes, pidfds or epoll: only stdio
    targets = res.payload["fds"]
    assert targets["0"] == "/dev/null" and targets["1"].endswith(".stdout")
    assert not [t for t in targets.values() if t.startswith(("pipe:", "socket:", "anon_inode:"))]
    assert sorted(targets) == ["0", "1", "2"] and res.payload["sid"]


def test_no_network_in_the_child(server: ForkServer) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    threading.Thread(target=lambda: listener.accept(), daemon=True).start()
    code = (f"import socket, json\ns = socket.socket()\ns.settimeout(3)\n"
            f"try:\n    s.connect(('127.0.0.1', {port})); r = 'connected'\n"
            f"except OSError as e:\n    r = type(e).__name__\n"
            f"open('result.json', 'w').write(json.dumps({{'r': r}}))")
    try:
        isolated = _run(server, code)
        open_net = _run(server, code, isolate_network=False)
    finally:
        listener.close()
    assert open_net.payload == {"r": "connected"}
    assert isolated.payload["r"] != "connected"


def test_stdout_flood_is_capped(server: ForkServer) -> None:
    res = _run(server, "import sys\nb = 'x' * (1 << 20)\nfor _ in range(1024): sys.stdout.write(b)",
               timeout_s=30, file_mb=16)
    assert res.payload is None and len(res.stdout) < 300_000


def test_fork_bomb_is_contained(server: ForkServer) -> None:
    marker = f"ksfsbomb{os.getpid()}{time.monotonic_ns()}"
    code = (f"import os\nMARK = '{marker}'\nwhile True:\n    try:\n        if os.fork() == 0:\n"
            "            os.setsid()\n    except OSError:\n        pass\n")
    res = _run(server, code, timeout_s=3, processes=64)
    assert res.timed_out
    if pids_cgroup_root() is not None:
        assert res.extra["pids_cgroup"] and res.extra["leftover_killed"] > 0
    ok = _run(server, "open('result.json', 'w').write('{}')")
    assert ok.payload == {}


def test_a_child_that_kills_the_server_fails_alone(tmp_path: Path) -> None:
    (tmp_path / "ks_test_entry.py").write_text(ENTRY)
    os.chmod(tmp_path, 0o755)
    srv = ForkServer(preload=(), env={"PYTHONPATH": f"{_PKG_ROOT}{os.pathsep}{tmp_path}"})
    try:
        srv.start()
        first_pid = srv.info["pid"]
        # the child cannot reach the server (its own pid namespace, another user) ...
        res = _run(srv, "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n"
                        "open('result.json', 'w').write('{}')")
        assert res.payload == {} and srv.info["pid"] == first_pid and srv.restarts == 0
        # ... and when the server dies anyway, the run in flight fails alone
        with ThreadPoolExecutor(1) as pool:
            fut = pool.submit(_run, srv, "import time\ntime.sleep(30)")
            time.sleep(2)
            os.kill(first_pid, 9)
            res = fut.result(timeout=60)
        assert res.payload is None and "stopped answering" in res.stderr
        ok = _run(srv, "open('result.json', 'w').write('{}')")  # a fresh server takes over
        assert ok.payload == {} and srv.info["pid"] != first_pid and srv.restarts == 1
    finally:
        srv.close()
