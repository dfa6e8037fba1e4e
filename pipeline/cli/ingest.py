"""`kernelsynth` commands for the ingest stage (registered on import)."""

from __future__ import annotations

from pipeline.cli.app import app  # noqa: F401
