"""Prefect settings for CLI use: quiet console, no telemetry, a workspace-local Prefect home.

Prefect reads its settings from the environment when it is first imported, so this runs before
any `import prefect`. Values the user already exported win (`setdefault`), so pointing
PREFECT_API_URL at a real server keeps working.
"""

from __future__ import annotations

import os
from pathlib import Path


def prefect_environment(workspace: Path, *, quiet: bool = True) -> dict[str, str]:
    """The Prefect settings `kernelsynth build` and `serve` run under (not yet applied)."""
    env = {
        # Without a server configured, Prefect starts a temporary local one for the process.
        "PREFECT_SERVER_ALLOW_EPHEMERAL_MODE": "true",
        # The run history lives beside the data it produced, not in ~/.prefect.
        "PREFECT_HOME": str(workspace / ".prefect"),
        # No network here and no reason to phone home from a data pipeline.
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
        # Stage logs still reach the UI (API handler); the terminal shows our own summary.
        "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "WARNING" if quiet else "INFO",
        "PREFECT_SERVER_LOGGING_LEVEL": "WARNING",
        # The flow's own task-run records are enough; results live in the workspace.
        "PREFECT_RESULTS_PERSIST_BY_DEFAULT": "false",
    }
    return env


def configure_prefect(workspace: Path, *, quiet: bool = True) -> None:
    """Apply `prefect_environment` to os.environ without overriding what the user set."""
    for key, value in prefect_environment(workspace, quiet=quiet).items():
        os.environ.setdefault(key, value)
    # Prefect's sqlite database cannot be created in a folder that does not exist yet.
    Path(os.environ["PREFECT_HOME"]).expanduser().mkdir(parents=True, exist_ok=True)
