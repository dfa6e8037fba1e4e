"""The `kernelsynth` command line. Each module registers its commands on `pipeline.cli.app`.

Commands that live outside `pipeline/` (the Prefect flows' `build` and `serve`) register through
the `kernelsynth.commands` entry point group, so `pipeline/` never imports `flows/`.
"""

from __future__ import annotations

from importlib.metadata import entry_points

from pipeline.cli import (  # noqa: F401
    benchmarks,
    core,
    datasets,
    generate,
    ingest,
    samples,
    serve_verifier,
    tasks,
    verify,
)
from pipeline.cli.app import app


def load_plugins() -> None:
    """Let installed packages add commands: each entry point is `register(app) -> None`."""
    for ep in entry_points(group="kernelsynth.commands"):
        ep.load()(app)


def main() -> None:
    load_plugins()
    app()
