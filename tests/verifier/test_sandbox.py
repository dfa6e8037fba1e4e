"""The sandbox: crashes, timeouts, floods and fork bombs end only the child, leaving nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from verifier_cases import tmp_venv  # noqa: E402

from verifier.isolation.cgroups import pids_cgroup_root  # noqa: E402
from verifier.isolation.sandbox import SandboxLimits, run_sandboxed  # noqa: E402

ROOT = Path(__file__).parents[2]


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


def test_the_childs_user_has_a_name() -> None:
    """The child's own user id is in no passwd file; getpass.getuser() (torch's compile cache
    folders, symbolic tracing) must still answer: on the H100 image every reference trace
    failed on it."""
    res = _py("import getpass, json, os\n"
              "open('result.json','w').write(json.dumps([getpass.getuser(), os.getuid()]))")
    assert res.payload is not None, res.describe_failure()
    assert res.payload[0] == "kssandbox"


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


# --- an interpreter in a virtualenv under /tmp (issue 28, item 6) ------------------------------
def test_a_spawned_child_runs_from_a_venv_under_tmp(tmp_path: Path) -> None:
    """The private /tmp keeps the venv (read-only): the child starts with the venv's packages.
    Before, the venv was hidden and the child was the base interpreter without torch."""
    venv = tmp_venv(tmp_path)
    code = ("import sys\nfrom verifier.isolation.sandbox import run_sandboxed\n"
            "r = run_sandboxed([sys.executable, '-c', \"import json, sys, torch, os; "
            "open('result.json', 'w').write(json.dumps({'prefix': sys.prefix, "
            "'torch': torch.__version__, 'w': os.access(sys.prefix, os.W_OK)}))\"])\n"
            "print(json.dumps(r.payload) if r.payload else 'FAILED ' + r.describe_failure())\n")
    p = subprocess.run([str(venv / "bin" / "python"), "-c", "import json\n" + code],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["prefix"] == str(venv) and out["torch"] and out["w"] is False


@pytest.mark.slow
def test_the_verifier_from_a_venv_under_tmp_gives_an_honest_verdict(tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from verifier_cases import RELU_TASK, relu_ok

    from verifier.protocol import CORRECT_STATUSES

    venv = tmp_venv(tmp_path)
    (tmp_path / "task.py").write_text(RELU_TASK)
    (tmp_path / "cand.md").write_text("```python\n" + relu_ok() + "```\n")
    p = subprocess.run([str(venv / "bin" / "python"), "-m", "verifier", "--task",
                        str(tmp_path / "task.py"), "--candidate", str(tmp_path / "cand.md"),
                        "--backend", "cpu", "--json", "--perf-trials", "3", "--cache-dir",
                        str(Path.home() / ".cache" / "kernelsynth-tests" / "verifier-builds")],
                       capture_output=True, text=True, timeout=900, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr[-3000:]
    v = json.loads(p.stdout)
    assert v["status"] in CORRECT_STATUSES, (v["status"], v["error"], v["compile_log"][-2000:])


def test_an_environment_that_fails_every_item_alike_is_named() -> None:
    from verifier.isolation.sandbox import common_failure

    broken = "worker exited with code 1: FileNotFoundError: [Errno 2] /tmp/venv/bin/python"
    assert common_failure([broken] * 3) == broken
    assert common_failure([broken] * 2) is None  # too few to tell
    assert common_failure([broken, broken, "worker died with SIGSEGV"]) is None
    assert common_failure(["worker died with SIGSEGV"] * 5) is None  # candidates' own crash


# a candidate's module that ends its process with the words of a hidden interpreter
DIES_AS_BROKEN = ("import os, sys\n"
                  "sys.stderr.write(\"FileNotFoundError: [Errno 2] No such file or directory: "
                  "'/tmp/venv/bin/python'\\n\")\nsys.stderr.flush()\nos._exit(1)\n")
# one that ends it with a signal (its own SIGKILL is ignored: the run is pid 1 of its namespace)
CRASHES = "import ctypes\nctypes.string_at(0)\n"


@pytest.mark.parametrize("launcher", ["spawn", "fork"])
def test_the_parent_knows_whether_a_run_reached_the_candidates_code(launcher: str) -> None:
    """The collect entry (`verifier.run.collect`) writes its byte on the parent's pipe just
    before the candidate's module runs (`verifier.isolation.started`), on either launcher: a
    module that prints a hidden interpreter's words and exits, or crashes (SIGSEGV), is said to
    have ended after the candidate's code started, and no number of them is a broken
    environment; a run whose entry fails before (its input missing, as an interpreter or
    verifier that cannot start fails) still is, word for word."""
    from verifier.isolation.sandbox import SpawnLauncher, common_failure
    from verifier.isolation.started import REACHED
    from verifier.run.forkserver import ForkServer

    server = ForkServer(preload=("verifier.run.collect",)) if launcher == "fork" else None
    run = (server or SpawnLauncher()).run_module
    try:
        limits = SandboxLimits(timeout_s=120)
        reached = [run("verifier.run.collect", limits=limits,
                       input_files={"candidate.py": DIES_AS_BROKEN}) for _ in range(3)]
        killed = run("verifier.run.collect", limits=limits,
                     input_files={"candidate.py": CRASHES})
        never = [run("verifier.run.collect", limits=limits) for _ in range(3)]
    finally:
        if server is not None:
            server.close()
    said = [r.describe_failure() for r in reached]
    assert all(r.started and r.payload is None for r in reached), said
    assert all(REACHED in s and "/tmp/venv/bin/python" in s for s in said), said
    assert common_failure(said) is None
    assert killed.started and killed.signal_name == "SIGSEGV", killed.describe_failure()
    assert killed.describe_failure().endswith(REACHED)
    assert common_failure([killed.describe_failure()] * 3) is None
    broken = [r.describe_failure() for r in never]
    assert not any(r.started for r in never) and REACHED not in broken[0], broken
    assert "FileNotFoundError" in broken[0] and common_failure(broken) == broken[0], broken


def test_what_a_run_that_reached_the_candidate_wrote_is_not_the_environments() -> None:
    """A result file written in the candidate's process (`candidates_words`): a never-started
    worker's words get the parent's REACHED; its own traceback and a module the install lacks
    keep their words (the latter still stops a run: the sandbox hides the install)."""
    from verifier.isolation.sandbox import candidates_words, common_failure
    from verifier.isolation.started import REACHED

    broken = "worker exited with code 1: FileNotFoundError: [Errno 2] /tmp/venv/bin/python"
    assert candidates_words(broken).endswith(f"({REACHED})")
    assert common_failure([candidates_words(broken)] * 3) is None
    own = "candidate.py line 9: PermissionError: [Errno 13] Permission denied: '/w.bin'"
    missing = "candidate.py line 3: ModuleNotFoundError: No module named 'numpy'"
    assert candidates_words(own) == own and candidates_words(missing) == missing
    assert common_failure([candidates_words(missing)] * 3) == missing
