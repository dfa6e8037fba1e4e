"""Options every command takes, and output helpers (rich tables, --json lines)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from pipeline.config import Config, ConfigError, load_config
from pipeline.workspace import Workspace

WorkspaceOpt = Annotated[
    Path | None,
    typer.Option("--workspace", "-w", help="Workspace directory (default: config, ./ks-data)."),
]
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help="Config YAML (default: ./kernelsynth.yaml).")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object per line.")]

console = Console(stderr=True)
out = Console()


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print a one-line error and return the Exit to raise."""
    console.print(f"[red]error:[/red] {message}", highlight=False)
    return typer.Exit(code)


def open_context(workspace: Path | None, config: Path | None) -> tuple[Config, Workspace]:
    """Load the config (CLI --workspace wins over the file) and open the workspace."""
    try:
        cfg = load_config(config, workspace)
    except ConfigError as exc:
        raise fail(str(exc), 2) from None
    return cfg, Workspace(cfg.workspace)


def emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, default=str) + "\n")
    sys.stdout.flush()


def print_table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    table = Table(title=title)
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*("" if v is None else str(v) for v in row))
    out.print(table)
