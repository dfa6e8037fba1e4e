"""The stages the flows run, gathered in a `StageSet` so a flow can be given others.

Every stage is a `pipeline.stage.Stage` (`run(batch, ctx) -> (records, rejections, counts)`, with
its declared resources); besides them a set names what feeds the first stage (a source reader)
and the whole-workspace steps after the last (selection, dataset rows, publishing). Flows receive
a set by import path (`"module:attribute"`), a plain string, so the choice survives deployment
parameters and process/Ray boundaries. `None` means the built-in pipeline.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from pipeline.stage import Stage


@dataclass(frozen=True)
class StageSet:
    """The pipeline's stages (pipeline/STAGES.md) and the steps around them."""

    read_sources: Callable[..., Iterable[Any]]  # (SourcesConfig, cache_dir, *, manifest)
    ingest: Stage  # what the sources yield -> RawModule
    tasks: Stage  # RawModule -> Task
    generate: Stage  # Task -> Candidate (first attempts)
    verify: Stage  # Candidate -> Verdict
    compile: Stage  # Candidate -> (build cache), before verify on Ray
    mutate: Stage  # Task (with its chains in ctx) -> Candidate
    repair: Stage  # Task (with its chains in ctx) -> Candidate (next turn)
    select: Callable[..., list[str]]  # (candidates, verdicts, k, weight, seed)
    build_datasets: Callable[..., dict[str, Any]]  # (tasks, candidates, verdicts, selected, cfg)
    publish: Callable[..., Path]  # (ws, tables, cfg, lineage)
    resolve_backend: Callable[[str], str]


@cache
def builtin_stages() -> StageSet:
    """The real pipeline (imported on first use: flows.stages stays cheap to import)."""
    from pipeline.candidates.stages import GENERATE, MUTATE, REPAIR
    from pipeline.candidates.verify import VERIFY, compile_stage
    from pipeline.datasets.publish import publish_version
    from pipeline.datasets.rows import build_datasets
    from pipeline.datasets.selection import select_diverse
    from pipeline.tasks.ingest import INGEST
    from pipeline.tasks.stages import TASKS
    from sources.collect import iter_modules
    from verifier.backends import select_backend

    return StageSet(read_sources=iter_modules, ingest=INGEST, tasks=TASKS, generate=GENERATE,
                    verify=VERIFY, compile=compile_stage(), mutate=MUTATE, repair=REPAIR,
                    select=select_diverse, build_datasets=build_datasets,
                    publish=publish_version, resolve_backend=select_backend)


class StageSetError(ValueError):
    """A stage import path does not name a StageSet; the message names the path."""


@cache
def load_stages(spec: str | None) -> StageSet:
    """The StageSet named by `module:attribute`, or the built-in pipeline for None."""
    if not spec:
        return builtin_stages()
    module_name, _, attr = spec.partition(":")
    try:
        obj = getattr(importlib.import_module(module_name), attr or "STAGES")
    except (ImportError, AttributeError) as exc:
        raise StageSetError(f"stages {spec!r}: cannot import ({exc})") from None
    if not isinstance(obj, StageSet):
        raise StageSetError(f"stages {spec!r}: is a {type(obj).__name__}, not a StageSet")
    return obj
