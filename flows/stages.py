"""The stage functions the flows call (pipeline/STAGES.md), gathered so a flow can be given others.

Flows receive stages by import path (`"module:attribute"`), a plain string, so the choice survives
deployment parameters and process/Ray boundaries. `None` means the built-in pipeline.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.stage import Stage


@dataclass(frozen=True)
class StageSet:
    """One callable per stage, with the signatures of pipeline/STAGES.md."""

    ingest: Callable[..., dict[str, int]]  # (ws, run, cfg) -> counts
    tasks: Callable[..., dict[str, int]]  # (ws, run, cfg) -> counts
    generate: Callable[..., tuple[list, list]]  # (tasks, GenerateConfig, backend)
    verify: Callable[..., tuple[list, list]]  # (tasks_by_id, candidates, VerifyConfig, cache_dir)
    mutate: Callable[..., list]  # (tasks, candidates, verdicts, GenerateConfig)
    repair: Callable[..., tuple[list, list]]  # (tasks, candidates, verdicts, Config, turn)
    select: Callable[..., list[str]]  # (candidates, verdicts, k, weight, seed)
    build_datasets: Callable[..., dict[str, Any]]  # (tasks, candidates, verdicts, selected, cfg)
    publish: Callable[..., Path]  # (ws, tables, cfg, lineage)
    resolve_backend: Callable[[str], str]


def _ingest(ws: Any, run: Any, cfg: Any) -> dict[str, int]:
    from pipeline.runner import StageProgress
    from pipeline.tasks.ingest import run_ingest

    with StageProgress("ingest", None) as progress:  # sources are discovered as they are read
        return run_ingest(ws, run, cfg, batch_size=cfg.flows.batch_size,
                          progress=lambda _record: progress(1))


def _tasks(ws: Any, run: Any, cfg: Any) -> dict[str, int]:
    from pipeline.runner import StageProgress
    from pipeline.tasks.stages import done_module_ids, run_tasks
    from schemas import RawModule

    done = done_module_ids(ws)
    pending = sum(m not in done for m in ws.read_table(RawModule).column("module_id").to_pylist())
    with StageProgress("tasks", pending) as progress:
        return run_tasks(ws, run, cfg, batch_size=cfg.flows.batch_size, progress=progress)


def _generate(tasks: list, cfg: Any, backend: str) -> tuple[list, list]:
    from pipeline.candidates.generate import generate_candidates

    return generate_candidates(tasks, cfg, backend)


def _verify(tasks: dict, candidates: list, cfg: Any, cache_dir: Path) -> tuple[list, list]:
    from pipeline.candidates.verify import verify_with_rejections

    return verify_with_rejections(tasks, candidates, cfg, cache_dir)


def _mutate(tasks: list, candidates: list, verdicts: list, cfg: Any) -> list:
    from pipeline.candidates.mutate import mutate_candidates

    return mutate_candidates(tasks, candidates, verdicts, cfg)


def _repair(tasks: list, candidates: list, verdicts: list, cfg: Any, turn: int
            ) -> tuple[list, list]:
    from pipeline.candidates.stages import repair_turn

    return repair_turn(tasks, candidates, verdicts, cfg, turn)


def _select(candidates: list, verdicts: list, k: int, weight: float, seed: int) -> list[str]:
    from pipeline.datasets.selection import select_diverse

    return select_diverse(candidates, verdicts, k, weight, seed)


def _build_datasets(tasks: list, candidates: list, verdicts: list, selected: list[str],
                    cfg: Any) -> dict[str, Any]:
    from pipeline.datasets.rows import build_datasets

    return build_datasets(tasks, candidates, verdicts, selected, cfg)


def _publish(ws: Any, tables: dict, cfg: Any, lineage: dict) -> Path:
    from pipeline.datasets.publish import publish_version

    return publish_version(ws, tables, cfg, lineage)


def _resolve_backend(requested: str) -> str:
    from verifier.backends import select_backend

    return select_backend(requested)


BUILTIN = StageSet(
    ingest=_ingest, tasks=_tasks, generate=_generate, verify=_verify, mutate=_mutate,
    repair=_repair, select=_select, build_datasets=_build_datasets, publish=_publish,
    resolve_backend=_resolve_backend,
)


class StageSetError(ValueError):
    """A stage import path does not name a StageSet; the message names the path."""


@cache
def load_stages(spec: str | None) -> StageSet:
    """The StageSet named by `module:attribute`, or the built-in pipeline for None."""
    if not spec:
        return BUILTIN
    module_name, _, attr = spec.partition(":")
    try:
        obj = getattr(importlib.import_module(module_name), attr or "STAGES")
    except (ImportError, AttributeError) as exc:
        raise StageSetError(f"stages {spec!r}: cannot import ({exc})") from None
    if not isinstance(obj, StageSet):
        raise StageSetError(f"stages {spec!r}: is a {type(obj).__name__}, not a StageSet")
    return obj


@dataclass(frozen=True)
class FlowStages:
    """The batch stages of a StageSet in the one `Stage` shape (pipeline/stage.py)."""

    generate: Stage
    verify: Stage
    compile: Stage
    mutate: Stage
    repair: Stage


@cache
def stage_objects(spec: str | None) -> FlowStages:
    """The StageSet named by `spec` wrapped as Stages, with the resources the pipeline declares."""
    from pipeline.candidates.stages import generate_stage, mutate_stage, repair_stage
    from pipeline.candidates.verify import compile_stage, verify_stage

    st = load_stages(spec)
    return FlowStages(generate=generate_stage(st.generate), verify=verify_stage(st.verify),
                      compile=compile_stage(st.verify), mutate=mutate_stage(st.mutate),
                      repair=repair_stage(st.repair))
