"""Prefect for the flow tests: a private PREFECT_HOME and one real server on loopback.

The environment is set at import, before anything imports prefect (it reads settings then), so
the tests never touch ~/.prefect. One `prefect server start` serves the whole session (in-process
flows, the SIGKILL subprocesses and the served deployment): a server costs seconds to start.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
# --import-mode=importlib adds nothing to sys.path; the fake stages are imported by name (also
# by subprocesses, through PYTHONPATH), so this folder goes on the path.
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from flows_harness import PREFECT_ENV, VENV_BIN, free_port  # noqa: E402

os.environ.update(PREFECT_ENV)
os.environ.pop("PREFECT_API_URL", None)
# Worker processes (Ray, process pools) import the fake stages by name too.
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Prefect server on 127.0.0.1 for the session; settings point the tests at it."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    home = tmp_path_factory.mktemp("prefect-server")
    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = dict(os.environ, PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_UI_ENABLED="false")
    log = open(home / "server.log", "wb")  # noqa: SIM115 - closed at teardown
    proc = subprocess.Popen([str(VENV_BIN / "prefect"), "server", "start", "--host", "127.0.0.1",
                             "--port", str(port), "--no-ui", "--analytics-off"],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 90
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"prefect server did not start: "
                               f"{(home / 'server.log').read_text(errors='replace')[-2000:]}")
        time.sleep(0.3)
    # Worker processes (Ray, process pools) read the environment, this process its settings.
    os.environ["PREFECT_API_URL"] = url
    try:
        with temporary_settings(updates={PREFECT_API_URL: url}):
            yield url
    finally:
        os.environ.pop("PREFECT_API_URL", None)
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
