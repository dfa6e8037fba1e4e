"""The `kernelsynth` command line. Each module registers its commands on `pipeline.cli.app`."""

from __future__ import annotations

from pipeline.cli import core  # noqa: F401  (registers commands)
from pipeline.cli.app import app


def main() -> None:
    app()
