"""Options every command takes, and output helpers (rich tables, --json lines)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:  # imported where used: `kernelsynth --help` loads no data library
    from pipeline.config import Config
    from pipeline.workspace import Workspace

WorkspaceOpt = Annotated[
    Path | None,
    typer.Option("--workspace", "-w", help="Workspace directory (default: config, ./ks-data)."),
]
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help="Config YAML (default: ./kernelsynth.yaml).")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object per line.")]
StagesOpt = Annotated[str | None, typer.Option(
    "--stages", hidden=True, help="module:attribute of a pipeline.stages.StageSet to run instead.")]

console = Console(stderr=True)
out = Console()


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print a one-line error and return the Exit to raise."""
    console.print(f"[red]error:[/red] {message}", highlight=False)
    return typer.Exit(code)


def open_context(workspace: Path | None, config: Path | None) -> tuple[Config, Workspace]:
    """Load the config (CLI --workspace wins over the file) and open the workspace."""
    from pipeline.config import ConfigError, load_config
    from pipeline.workspace import Workspace

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


class RateColumn(ProgressColumn):
    """Items per second of a task (rich's own speed column counts bytes)."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("-/s" if speed is None else f"{speed:.2f}/s", style="progress.data.speed")


class RichProgressSink:
    """A `pipeline.runner.ProgressSink` drawing one rich bar per stage: done/total, rate, ETA."""

    def __init__(self, con: Console):
        self.bars = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                             RateColumn(), TimeElapsedColumn(), TextColumn("eta"),
                             TimeRemainingColumn(), console=con, transient=False)
        self.ids: dict[int, TaskID] = {}

    def start(self, key: int, stage: str, total: int | None) -> None:
        self.ids[key] = self.bars.add_task(escape(stage), total=total)

    def advance(self, key: int, n: int) -> None:
        self.bars.advance(self.ids[key], n)

    def finish(self, key: int) -> None:
        task_id = self.ids.pop(key)
        task = self.bars.tasks[[t.id for t in self.bars.tasks].index(task_id)]
        if task.total is None:  # a stage of unknown size is complete at what it reached
            self.bars.update(task_id, total=task.completed)
        self.bars.stop_task(task_id)


@contextmanager
def stage_progress_bars(con: Console, enabled: bool = True) -> Iterator[None]:
    """Show a progress bar per stage on `con` while the block runs (nothing when disabled)."""
    if not enabled:
        yield
        return
    from pipeline.runner import set_progress_sink

    sink = RichProgressSink(con)
    previous = set_progress_sink(sink)
    try:
        with sink.bars:
            yield
    finally:
        set_progress_sink(previous)
