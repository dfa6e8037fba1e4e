"""Foundation commands: `config show`, `tasks validate`, `sql`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pipeline.cli.app import app, config_app, tasks_app
from pipeline.cli.common import (
    ConfigOpt,
    JsonOpt,
    WorkspaceOpt,
    console,
    emit_json,
    fail,
    open_context,
    out,
    print_table,
)


@config_app.command("show")
def config_show(workspace: WorkspaceOpt = None, config: ConfigOpt = None,
                json_: JsonOpt = False) -> None:
    """Print the effective configuration (defaults merged with the config file)."""
    from pipeline.config import ConfigError, dump_config, load_config

    try:
        cfg = load_config(config, workspace)
    except ConfigError as exc:
        raise fail(str(exc), 2) from None
    if json_:
        emit_json(cfg.model_dump(mode="json"))
    else:
        out.print(dump_config(cfg), end="", highlight=False)


@tasks_app.command("validate")
def tasks_validate(
    files: Annotated[list[Path], typer.Argument(help="KernelBench task files.")],
    workspace: WorkspaceOpt = None,
    config: ConfigOpt = None,
    json_: JsonOpt = False,
    timeout: Annotated[float, typer.Option(help="Seconds per file.")] = 30.0,
    scale: Annotated[bool, typer.Option(help="Scale large dims down for the CPU run.")] = True,
) -> None:
    """Load each task file in a sandbox, run its reference on CPU; exit 0 only if every file is
    valid or too_large_for_host (its sizes are meant for a GPU: the host's allocator refused)."""
    from pipeline.tasks.taskfile import validate_task_files

    cfg, _ = open_context(workspace, config)
    reports = validate_task_files(files, workers=cfg.tasks.workers, timeout_s=timeout,
                                  scale=scale, cpu_max_numel=cfg.tasks.cpu_max_numel)
    if json_:
        for r in reports:
            emit_json(r.to_json())
    else:
        rows = [[r.path, "yes" if r.valid else "too_large_for_host" if r.too_large_for_host
                 else "no", r.task_id,
                 "; ".join(f"{s.name}{s.shape}:{s.dtype}" for s in r.inputs), r.reason]
                for r in reports]
        print_table("task files", ["path", "valid", "task_id", "inputs", "reason"], rows)
        big = sum(r.too_large_for_host for r in reports)
        console.print(f"{sum(r.valid for r in reports)} valid, {big} too_large_for_host (valid "
                      f"on a GPU, no CPU copy), {len(reports) - big - sum(r.valid for r in reports)}"
                      " invalid", highlight=False)
    if not all(r.valid or r.too_large_for_host for r in reports):
        raise typer.Exit(1)


@app.command("sql")
def sql(
    query: Annotated[str, typer.Argument(help="DuckDB SQL over raw_modules, tasks, ...")],
    workspace: WorkspaceOpt = None,
    config: ConfigOpt = None,
    json_: JsonOpt = False,
) -> None:
    """Run DuckDB SQL over views of the workspace tables and print the result."""
    import duckdb

    from pipeline.workspace import WorkspaceError

    _, ws = open_context(workspace, config)
    try:
        con = ws.duckdb()
        from pipeline.datasets.catalog import attach_catalog  # ds_<config>, ws_<table>, versions

        try:
            attach_catalog(ws, con)
        except duckdb.Error as exc:  # e.g. a build holding catalog.duckdb: workspace tables only
            console.print(f"[yellow]warning:[/yellow] catalog.duckdb not attached: "
                          f"{str(exc).splitlines()[0]}", highlight=False)
        rel = con.sql(query)
    except WorkspaceError as exc:
        raise fail(str(exc)) from None
    except duckdb.Error as exc:
        raise fail(f"SQL error: {str(exc).splitlines()[0]}") from None
    if rel is None:
        return
    cols = rel.columns
    rows = rel.fetchall()
    if json_:
        for row in rows:
            emit_json(dict(zip(cols, row, strict=True)))
    else:
        print_table("", cols, [list(r) for r in rows])
