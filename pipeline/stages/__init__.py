"""Every Stage object of the pipeline, one file per stage, gathered in a `StageSet`.

Each stage is a `pipeline.stage.Stage` (`run(batch, ctx) -> (records, rejections, counts)`, with
its declared resources); besides them a set names what feeds the first stage (a source reader).
The plan (`pipeline.plan`) runs a set's stages in its one order, whatever the executor (the local
runner or the Prefect flows). Executors receive a set by import path (`"module:attribute"`), a
plain string, so the choice survives deployment parameters and process/Ray boundaries; `None`
means the built-in pipeline.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from typing import Any

from pipeline.stage import Stage


@dataclass(frozen=True)
class StageSet:
    """The pipeline's stages (pipeline/STAGES.md) and what feeds the first."""

    read_sources: Callable[..., Iterable[Any]]  # (SourcesConfig, cache_dir, *, manifest)
    ingest: Stage  # what the sources yield -> RawModule
    tasks: Stage  # RawModule -> Task
    generate: Stage  # Task -> Candidate (first attempts)
    verify: Stage  # Candidate -> Verdict
    compile: Stage  # Candidate -> (build cache), before verify on Ray
    mutate: Stage  # Task (with its chains in ctx) -> Candidate
    repair: Stage  # Task (with its chains in ctx) -> Candidate (next turn)
    resolve_backend: Callable[[str], str]  # `auto` -> the backend of this machine

    def stage(self, name: str) -> Stage:
        """The stage called `name` (ingest, tasks, generate, verify, compile, mutate, repair)."""
        found = getattr(self, name, None)
        if not isinstance(found, Stage):
            raise StageSetError(f"no stage {name!r} in the stage set")
        return found


@cache
def builtin_stages() -> StageSet:
    """The real pipeline (imported on first use: this module stays cheap to import)."""
    from pipeline.stages.compile import COMPILE
    from pipeline.stages.generate import GENERATE
    from pipeline.stages.ingest import INGEST
    from pipeline.stages.mutate import MUTATE
    from pipeline.stages.repair import REPAIR
    from pipeline.stages.tasks import TASKS
    from pipeline.stages.verify import VERIFY
    from sources.collect import iter_modules
    from verifier.backends import select_backend

    return StageSet(read_sources=iter_modules, ingest=INGEST, tasks=TASKS, generate=GENERATE,
                    verify=VERIFY, compile=COMPILE, mutate=MUTATE, repair=REPAIR,
                    resolve_backend=select_backend)


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
