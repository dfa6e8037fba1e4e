"""`kernelsynth tasks build` and `kernelsynth tasks show` (registered on import)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.syntax import Syntax

from pipeline.cli.app import app, tasks_app  # noqa: F401
from pipeline.cli.common import (
    ConfigOpt,
    JsonOpt,
    StagesOpt,
    WorkspaceOpt,
    console,
    emit_json,
    fail,
    open_context,
    out,
    print_table,
    stage_progress_bars,
)


@tasks_app.command("build")
def tasks_build(
    workers: Annotated[int | None, typer.Option(help="Parallel sandboxed probes.")] = None,
    timeout: Annotated[float | None, typer.Option(help="Seconds per module.")] = None,
    decontaminate: Annotated[list[str] | None, typer.Option(
        "--decontaminate", help="Benchmark directory to decontaminate against (repeatable).")
    ] = None,
    workspace: WorkspaceOpt = None,
    config: ConfigOpt = None,
    json_: JsonOpt = False,
    stages: StagesOpt = None,
) -> None:
    """Turn the workspace's RawModules into curated KernelBench tasks."""
    from pipeline.plan import run_step
    from pipeline.runner import local_executor
    from pipeline.workspace import WorkspaceError
    from schemas import RawModule

    cfg, ws = open_context(workspace, config)
    upd: dict[str, object] = {}
    if workers is not None:
        upd["workers"] = workers
    if timeout is not None:
        upd["timeout_s"] = timeout
    if decontaminate:
        upd["decontaminate_against"] = list(cfg.tasks.decontaminate_against) + decontaminate
    cfg = cfg.model_copy(update={"tasks": cfg.tasks.model_copy(update=upd)})
    try:
        if not ws.read_table(RawModule).num_rows:
            raise fail(f"{ws.root}: no raw modules; run `kernelsynth ingest` first")
        ex = local_executor(ws, cfg, stages=stages)
        with stage_progress_bars(console, enabled=not json_):
            counts = run_step(ex, "tasks")
    except WorkspaceError as exc:
        raise fail(str(exc)) from None
    run = ex.run
    if json_:
        emit_json({"command": "tasks build", "run": run.run_id, **counts})
    else:
        print_table("tasks build", ["count", "value"], [[k, v] for k, v in sorted(counts.items())])
    if counts.get("tasks", 0) == 0 and counts.get("skipped", 0) == 0:
        raise typer.Exit(1)


@tasks_app.command("show")
def tasks_show(
    task_id: Annotated[str, typer.Argument(help="Task id (a unique prefix is enough).")],
    workspace: WorkspaceOpt = None,
    config: ConfigOpt = None,
    json_: JsonOpt = False,
) -> None:
    """Print a task file with its shape annotations, and its reasoning trace."""
    from pipeline.workspace import WorkspaceError
    from schemas import Task

    _, ws = open_context(workspace, config)
    try:
        tasks = [t for t in ws.read(Task) if t.task_id.startswith(task_id)]
    except WorkspaceError as exc:
        raise fail(str(exc)) from None
    if not tasks:
        raise fail(f"no task {task_id!r} in {ws.root}")
    if len(tasks) > 1:
        raise fail(f"{task_id!r} matches {len(tasks)} tasks; give more characters")
    t = tasks[0]
    if json_:
        emit_json({"task_id": t.task_id, "name": t.name, "level": t.level,
                   "op_families": t.op_families, "op_inventory": t.op_inventory,
                   "flops": t.flops, "bytes_moved": t.bytes_moved, "source": t.source,
                   "reasoning": t.reasoning, "decontamination": t.decontamination})
        return
    out.print(f"[bold]{t.task_id}[/bold]  {t.name}  level {t.level}  "
              f"families: {', '.join(t.op_families)}  ({t.source_kind}: {t.path})",
              highlight=False)
    out.print(Syntax(t.source, "python", line_numbers=False, word_wrap=True))
    out.print("[bold]Reasoning[/bold]")
    out.print(t.reasoning, highlight=False, markup=False)
