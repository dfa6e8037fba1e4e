"""`kernelsynth` commands for the verify stage (registered on import)."""

from __future__ import annotations

from pipeline.cli.app import app  # noqa: F401
