"""`kernelsynth generate` and `kernelsynth repair` (registered on import)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

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

if TYPE_CHECKING:
    from pipeline.config import Config

# pipeline.candidates.generate.GENERATORS, spelled here so `--help` imports no generator
# (tests/pipeline/test_cli_startup.py checks the two agree)
GENERATOR_NAMES = ("template", "openai", "hf", "import", "mutate")


def _apply(cfg: Config, **updates: object) -> Config:
    gen = {k: v for k, v in updates.items() if v is not None}
    return cfg.model_copy(update={"generate": cfg.generate.model_copy(update=gen)})


def _summary(title: str, counts: dict[str, int], json_: bool) -> None:
    if json_:
        emit_json({"command": title, **counts})
    else:
        print_table(title, ["count", "value"], [[k, v] for k, v in sorted(counts.items())])


@app.command("generate")
def generate(
    generator: Annotated[list[str] | None, typer.Option(
        "--generator", "-g", help=f"Generator(s): {'|'.join(GENERATOR_NAMES)} (repeatable).")] = None,
    backend: Annotated[str | None, typer.Option(help="auto|cuda|musa|cpu.")] = None,
    variants: Annotated[int | None, typer.Option(help="Template variants per task.")] = None,
    samples: Annotated[int | None, typer.Option(
        "--n-samples", help="LLM samples per task.")] = None,
    samples_file: Annotated[str | None, typer.Option(
        "--samples", help="import: JSONL/Parquet of model responses (task_id or prompt, "
        "response, model).")] = None,
    model: Annotated[str | None, typer.Option(
        help="Model: the served model (openai) or a local checkpoint (hf).")] = None,
    base_url: Annotated[str | None, typer.Option(help="OpenAI-compatible base URL.")] = None,
    temperature: Annotated[float | None, typer.Option()] = None,
    max_tokens: Annotated[int | None, typer.Option()] = None,
    concurrency: Annotated[int | None, typer.Option(help="Concurrent LLM requests.")] = None,
    workspace: WorkspaceOpt = None,
    config: ConfigOpt = None,
    json_: JsonOpt = False,
    stages: StagesOpt = None,
) -> None:
    """Generate candidate kernels for the workspace's tasks (`-g mutate`: the mutate step)."""
    from pipeline.candidates.generate import GENERATORS, GenerateError
    from pipeline.candidates.import_samples import SampleFileError
    from pipeline.candidates.llm import LLMError
    from pipeline.plan import run_step
    from pipeline.prompts import PromptError
    from pipeline.runner import local_executor
    from pipeline.workspace import WorkspaceError
    from schemas import Task

    cfg, ws = open_context(workspace, config)
    gens = generator or cfg.generate.generators
    unknown = [g for g in gens if g not in GENERATORS]
    if unknown:
        raise fail(f"--generator: unknown {', '.join(unknown)} (known: {', '.join(GENERATORS)})",
                   2)
    model_updates: dict[str, object] = {}
    if model is not None:
        model_updates["hf_model" if gens == ["hf"] else "openai_model"] = model
    cfg = _apply(cfg, generators=gens, backend=backend, variants_per_task=variants,
                 samples=samples, import_file=samples_file, openai_base_url=base_url,
                 temperature=temperature,
                 max_tokens=max_tokens, concurrency=concurrency, **model_updates)
    try:
        if not ws.read_table(Task).num_rows:
            raise fail(f"{ws.root}: no tasks; run `kernelsynth tasks build` first")
        ex = local_executor(ws, cfg, stages=stages)
        with stage_progress_bars(console, enabled=not json_):
            counts = run_step(ex, "generate") if gens != ["mutate"] else {}
            if "mutate" in gens:  # mutation needs verdicts: the plan's mutate step
                counts = {**counts, **run_step(ex, "mutate")}
    except (GenerateError, PromptError, LLMError, WorkspaceError, SampleFileError) as exc:
        raise fail(str(exc)) from None
    _summary("generate", {**counts, "run": ex.run_id}, json_)


@app.command("mutate")
def mutate(
    workspace: WorkspaceOpt = None,
    config: ConfigOpt = None,
    json_: JsonOpt = False,
    stages: StagesOpt = None,
) -> None:
    """Bug-injected variants of verified-correct kernels (`generate.mutation_rounds` rounds of
    mutate + verify): failing first turns whose fix is known, for `repair` and review rows."""
    from pipeline.plan import run_step
    from pipeline.runner import local_executor
    from pipeline.workspace import WorkspaceError

    cfg, ws = open_context(workspace, config)
    try:
        ex = local_executor(ws, cfg, stages=stages)
        with stage_progress_bars(console, enabled=not json_):
            counts = run_step(ex, "mutate")
    except WorkspaceError as exc:
        raise fail(str(exc)) from None
    _summary("mutate", {**counts, "run": ex.run_id}, json_)


@app.command("repair")
def repair(
    turns: Annotated[int | None, typer.Option(help="Repair turns (default: config).")] = None,
    generator: Annotated[str | None, typer.Option(
        help="auto (known fix for mutations, else the LLM) | fix | openai | hf.")] = None,
    model: Annotated[str | None, typer.Option(help="The served model for LLM repairs.")] = None,
    base_url: Annotated[str | None, typer.Option(help="OpenAI-compatible base URL.")] = None,
    no_verify: Annotated[bool, typer.Option(
        "--no-verify", help="Do not verify each turn (only the first turn is made).")] = False,
    workspace: WorkspaceOpt = None,
    config: ConfigOpt = None,
    json_: JsonOpt = False,
    stages: StagesOpt = None,
) -> None:
    """Continue failing candidates with verifier feedback as the next turn, up to N turns."""
    from pipeline.candidates.llm import LLMError
    from pipeline.plan import run_step
    from pipeline.prompts import PromptError
    from pipeline.runner import local_executor
    from pipeline.workspace import WorkspaceError

    cfg, ws = open_context(workspace, config)
    rep = {k: v for k, v in {"turns": turns, "generator": generator}.items() if v is not None}
    if no_verify:
        rep["verify"] = False
    if rep.get("generator") not in (None, "auto", "fix", "openai", "hf", "llm"):
        raise fail(f"--generator {generator!r}: expected auto, fix, openai or hf", 2)
    cfg = _apply(cfg, openai_model=model, openai_base_url=base_url)
    cfg = cfg.model_copy(update={"repair": cfg.repair.model_copy(update=rep)})
    try:
        ex = local_executor(ws, cfg, stages=stages)
        with stage_progress_bars(console, enabled=not json_):
            counts = run_step(ex, "repair")
    except (LLMError, WorkspaceError, PromptError) as exc:
        raise fail(str(exc)) from None
    if counts.get("unverified"):
        console.print("[yellow]note:[/yellow] turns after the first need verdicts: "
                      "run `kernelsynth verify`, then `kernelsynth repair` again", highlight=False)
    _summary("repair", {**counts, "run": ex.run_id}, json_)
