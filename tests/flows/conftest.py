"""Prefect for the flow tests: a private PREFECT_HOME and one real server on loopback.

The environment is set at import, before anything imports prefect (it reads settings then), so
the tests never touch ~/.prefect. One `prefect server start` serves the whole session (in-process
flows, the SIGKILL subprocesses and the served deployment): a server costs seconds to start.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

_HOME = Path(tempfile.mkdtemp(prefix="ks-prefect-"))
PREFECT_ENV = {
    "PREFECT_HOME": str(_HOME),
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_ALLOW_EPHEMERAL_MODE": "true",
    "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "WARNING",
    "PREFECT_SERVER_LOGGING_LEVEL": "WARNING",
    "PREFECT_RESULTS_PERSIST_BY_DEFAULT": "false",
}
os.environ.update(PREFECT_ENV)
os.environ.pop("PREFECT_API_URL", None)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
VENV_BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(api_url: str, **extra: str) -> dict[str, str]:
    """Environment for subprocesses: our Prefect settings, the server, the fake stages."""
    env = dict(os.environ)
    env.update(PREFECT_ENV)
    env["PREFECT_API_URL"] = api_url
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(REPO), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


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
    try:
        with temporary_settings(updates={PREFECT_API_URL: url}):
            yield url
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
