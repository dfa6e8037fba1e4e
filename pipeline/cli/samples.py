"""`kernelsynth prompts export`: the `rl` config's task prompts as JSONL for offline sampling."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from pipeline.cli.app import app
from pipeline.cli.common import (
    ConfigOpt,
    JsonOpt,
    WorkspaceOpt,
    emit_json,
    fail,
    open_context,
    out,
)

prompts_app = typer.Typer(help="Task prompts for offline batch generation (vLLM and friends).",
                          no_args_is_help=True)
app.add_typer(prompts_app, name="prompts")


@prompts_app.command("export")
def export(
    out_file: Annotated[Path, typer.Option("--out", help="JSONL to write.")],
    backend: Annotated[str | None, typer.Option(help="auto|cuda|musa|cpu.")] = None,
    workspace: WorkspaceOpt = None,
    config: ConfigOpt = None,
    json_: JsonOpt = False,
) -> None:
    """One line per task: task_id, backend and the chat messages (the `rl` rows' prompt)."""
    from pipeline.candidates.generate import resolve_backend
    from pipeline.prompts import PromptError, build_prompt
    from schemas import Task

    cfg, ws = open_context(workspace, config)
    chosen = resolve_backend(backend or cfg.generate.backend)
    tasks = ws.read(Task)
    if not tasks:
        raise fail(f"{ws.root}: no tasks; run `kernelsynth tasks build` first")
    try:
        lines = [json.dumps({"task_id": t.task_id, "backend": chosen, "messages": [
            {"role": m.role, "content": m.content} for m in build_prompt(t, chosen, cfg.generate)
        ]}) for t in tasks]
    except PromptError as exc:
        raise fail(str(exc)) from None
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    if json_:
        emit_json({"command": "prompts export", "prompts": len(lines), "out": str(out_file)})
    else:
        out.print(f"{len(lines)} prompts ({chosen}) -> {out_file}")
