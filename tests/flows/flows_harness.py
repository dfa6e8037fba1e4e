"""Prefect settings for the flow tests and the environment their subprocesses get."""

from __future__ import annotations

import os
import socket
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
VENV_BIN = Path(sys.executable).parent
PREFECT_ENV = {
    "PREFECT_HOME": tempfile.mkdtemp(prefix="ks-prefect-"),
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_ALLOW_EPHEMERAL_MODE": "true",
    "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "WARNING",
    "PREFECT_SERVER_LOGGING_LEVEL": "WARNING",
    "PREFECT_RESULTS_PERSIST_BY_DEFAULT": "false",
}


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
