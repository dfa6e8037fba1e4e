"""`kernelsynth` commands for the tasks stage (registered on import)."""

from __future__ import annotations

from pipeline.cli.app import app  # noqa: F401
