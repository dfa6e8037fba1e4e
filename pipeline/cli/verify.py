"""`kernelsynth verify`: verify the workspace's candidates that have no verdict yet."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from pipeline.cli.app import app
from pipeline.cli.common import (
    ConfigOpt,
    JsonOpt,
    WorkspaceOpt,
    console,
    emit_json,
    fail,
    open_context,
    print_table,
)


@app.command("verify")
def verify(
    workspace: WorkspaceOpt = None,
    config: ConfigOpt = None,
    json_: JsonOpt = False,
    backend: Annotated[str | None, typer.Option(help="auto | cpu | cuda | musa")] = None,
    workers: Annotated[int | None, typer.Option(help="Execution workers.")] = None,
    gpus: Annotated[int | None, typer.Option(
        help="GPU backends: one execution worker on each of the first N visible GPUs "
             "(default: every GPU of the host).")] = None,
    compile_only: Annotated[bool, typer.Option(help="Stop after compiling.")] = False,
    fallback: Annotated[str | None, typer.Option(
        help="strict (no library compute in forward) | partial (library ops allowed when an "
             "own kernel runs)")] = None,
    limit: Annotated[int | None, typer.Option(help="Verify at most this many.")] = None,
) -> None:
    """Verify candidates without verdicts; write verdicts to a new run of the workspace."""
    from pipeline.candidates.verify import run_verify
    from pipeline.workspace import WorkspaceError
    from schemas import Candidate, Verdict
    from verifier.backends import BackendUnavailable
    from verifier.protocol import STATUSES

    cfg, ws = open_context(workspace, config)
    if fallback is not None and fallback not in ("strict", "partial"):
        raise fail(f"--fallback must be strict or partial, not {fallback!r}")
    update = {k: v for k, v in {"backend": backend, "workers": workers, "gpus": gpus,
                                "fallback": fallback}.items() if v is not None}
    if compile_only:
        update["compile_only"] = True
    if update:
        cfg = cfg.model_copy(update={"verify": cfg.verify.model_copy(update=update)})
    try:
        todo = len(ws.done_keys(Candidate) - ws.done_keys(Verdict))
    except WorkspaceError as exc:
        raise fail(str(exc)) from None
    if limit is not None:
        todo = min(todo, limit)
    run = ws.new_run()
    with Progress(TextColumn("verify"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, disable=json_ or todo == 0) as bar:
        task = bar.add_task("verify", total=todo)

        def tick(v) -> None:
            bar.advance(task)
            if json_:
                emit_json({"candidate_id": v.candidate_id, "status": v.status,
                           "reward": v.reward, "speedup": v.speedup})

        try:
            counts = run_verify(ws, run, cfg, limit=limit, progress=tick)
        except (BackendUnavailable, WorkspaceError) as exc:
            raise fail(str(exc)) from None
    if json_:
        emit_json({"run": run.run_id, **counts})
    else:
        rows = [[k, counts[k]] for k in ("candidates", "skipped", "verified", "rejected",
                                         *STATUSES) if counts.get(k)]
        print_table(f"verify ({run.run_id})", ["", "count"], rows)
