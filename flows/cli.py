"""`kernelsynth build` and `kernelsynth serve`: registered on the CLI through an entry point."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the flow commands to the kernelsynth CLI."""
