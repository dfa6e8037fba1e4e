"""`kernelsynth verify`: verify the workspace's candidates that have no verdict yet."""

from __future__ import annotations

from typing import Annotated

import typer

from pipeline.cli.app import app
from pipeline.cli.common import (
    ConfigOpt,
    JsonOpt,
    StagesOpt,
    WorkspaceOpt,
    console,
    emit_json,
    fail,
    open_context,
    print_table,
    stage_progress_bars,
)


@app.command("verify")
def verify(
    workspace: WorkspaceOpt = None,
    config: ConfigOpt = None,
    json_: JsonOpt = False,
    stages: StagesOpt = None,
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
    """Verify the backend's candidates without verdicts; write verdicts to a new run."""
    from pipeline.plan import run_step
    from pipeline.runner import local_executor
    from pipeline.workspace import WorkspaceError
    from verifier.backends import BackendUnavailable
    from verifier.protocol import STATUSES

    cfg, ws = open_context(workspace, config)
    if fallback is not None and fallback not in ("strict", "partial"):
        raise fail(f"--fallback must be strict or partial, not {fallback!r}")
    update = {k: v for k, v in {"backend": backend, "workers": workers, "gpus": gpus,
                                "fallback": fallback}.items() if v is not None}
    if compile_only:
        update["compile_only"] = True
    cfg = cfg.model_copy(update={"verify": cfg.verify.model_copy(update=update)})
    if backend is not None:  # the plan pins generate and verify to one backend
        cfg = cfg.model_copy(update={"generate": cfg.generate.model_copy(
            update={"backend": backend})})

    def tick(v) -> None:
        if json_:
            emit_json({"candidate_id": v.candidate_id, "status": v.status,
                       "reward": v.reward, "speedup": v.speedup})

    try:
        ex = local_executor(ws, cfg, stages=stages, on_verdict=tick)
        with stage_progress_bars(console, enabled=not json_):
            counts = run_step(ex, "verify", limit=limit)
    except (BackendUnavailable, WorkspaceError) as exc:
        raise fail(str(exc)) from None
    if json_:
        emit_json({"run": ex.run_id, **counts})
    else:
        rows = [[k, counts[k]] for k in ("pending", "orphans", "verified", "rejections",
                                         *STATUSES) if counts.get(k)]
        print_table(f"verify ({ex.run_id})", ["", "count"], rows)
