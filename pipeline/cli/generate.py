"""`kernelsynth generate` and `kernelsynth repair` (registered on import)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import Progress

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

if TYPE_CHECKING:
    from pipeline.config import Config

# pipeline.candidates.generate.GENERATORS, spelled here so `--help` imports no generator
# (tests/pipeline/test_cli_startup.py checks the two agree)
GENERATOR_NAMES = ("template", "openai", "hf", "import", "mutate")


def _api_key(cfg: Config) -> str | None:
    # secrets are read here, at the CLI edge, and passed down explicitly
    return os.environ.get(cfg.generate.openai_api_key_env) or None


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
) -> None:
    """Generate candidate kernels for the workspace's tasks."""
    from pipeline.candidates.generate import GENERATORS, GenerateError, run_generate
    from pipeline.candidates.import_samples import SampleFileError
    from pipeline.candidates.llm import LLMError
    from pipeline.candidates.prompts import PromptError
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
        n_tasks = len(ws.read(Task))
        if n_tasks == 0:
            raise fail(f"{ws.root}: no tasks; run `kernelsynth tasks build` first")
        run = ws.new_run()
        with Progress(console=console, transient=True, disable=json_) as bar:
            steps = n_tasks * sum(g != "mutate" for g in gens)
            job = bar.add_task("generating", total=steps or None)
            counts = run_generate(ws, run, cfg, api_key=_api_key(cfg),
                                  progress=lambda k: bar.advance(job, k))
    except (GenerateError, PromptError, LLMError, WorkspaceError, SampleFileError) as exc:
        raise fail(str(exc)) from None
    counts["run"] = run.run_id  # type: ignore[assignment]
    _summary("generate", counts, json_)
    if not any(counts.get(k, 0) for k in ("candidates", "skipped", "skipped_tasks")):
        raise typer.Exit(1)


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
) -> None:
    """Continue failing candidates with verifier feedback as the next turn, up to N turns."""
    from pipeline.candidates.generate import run_repair
    from pipeline.candidates.llm import LLMError
    from pipeline.candidates.prompts import PromptError
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
        run = ws.new_run()
        counts = run_repair(ws, run, cfg, api_key=_api_key(cfg))
    except (LLMError, WorkspaceError, PromptError) as exc:
        raise fail(str(exc)) from None
    if counts.get("unverified"):
        console.print("[yellow]note:[/yellow] turns after the first need verdicts: "
                      "run `kernelsynth verify`, then `kernelsynth repair` again", highlight=False)
    counts["run"] = run.run_id  # type: ignore[assignment]
    _summary("repair", counts, json_)
