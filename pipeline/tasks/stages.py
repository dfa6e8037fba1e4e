"""`run_tasks`: the tasks stage over a workspace (RawModules -> curated Tasks), resumable.

Modules already turned into tasks, or rejected by extraction or curation (curate rejections
are keyed by module id), are skipped. Modules are processed in batches on `cfg.tasks.workers`
sandboxed probe workers shared by all batches; each batch's tasks and rejections are written as
one part each, so a crash loses at most the batch in flight.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.config import Config, TasksConfig
from pipeline.runner import run_batches
from pipeline.stage import Resources, Stage, StageContext, StageOutput
from pipeline.tasks.curate import curate_tasks
from pipeline.tasks.extract import extract_tasks
from pipeline.tasks.probe_pool import ProbePool
from pipeline.workspace import Run, Workspace
from schemas import RawModule, Rejection, Task

SKIP_STAGES = ("extract", "curate")


def done_module_ids(ws: Workspace) -> set[str]:
    """Module ids that already became a task or were rejected by this stage."""
    done = set(ws.read_table(Task).column("module_id").to_pylist())
    rej = ws.read_table(Rejection)
    if rej.num_rows:
        mask = pc.is_in(rej.column("stage"), value_set=pa.array(SKIP_STAGES))
        done.update(rej.filter(mask).column("item_id").to_pylist())
    return done


def _needs(cfg: Config, backend: str) -> Resources:
    # one sandboxed probe worker per slot, each under its own address-space limit
    workers = max(1, cfg.tasks.workers)
    return Resources(cpus=workers, memory_gb=workers * cfg.tasks.probe_memory_mb / 1024,
                     subprocesses=True)


def tasks_cfg(ctx: StageContext) -> TasksConfig:
    """The tasks config with git clones (for helpers in sibling files) under the cache dir."""
    if ctx.cfg.tasks.repo_cache_dir or not ctx.cache_dir:
        return ctx.cfg.tasks
    return ctx.cfg.tasks.model_copy(update={"repo_cache_dir": ctx.cache_dir})


def _tasks_batch(batch: list[RawModule], ctx: StageContext) -> StageOutput:
    # extract on the probe pool, then curate against every task kept so far (ctx.tasks grows)
    tasks, rejections = extract_tasks(batch, tasks_cfg(ctx), pool=ctx.pool)
    bench = Path(ctx.benchmark_dir) if ctx.benchmark_dir else None
    kept, dropped = curate_tasks(tasks, ctx.cfg.tasks, list(ctx.tasks.values()), bench)
    ctx.tasks.update((t.task_id, t) for t in kept)
    counts: Counter[str] = Counter(tasks=len(kept), rejected=len(rejections),
                                   curated_out=len(dropped))
    counts.update(f"reason:{r.reason}" for r in rejections + dropped)
    return StageOutput(kept, rejections + dropped, counts)


def _probe_pool(cfg: Config) -> ProbePool:
    return ProbePool(cfg.tasks.workers, cfg.tasks.probe_memory_mb)


# RawModules -> curated Tasks on one probe pool; batches run in order (curation dedups each
# batch against the tasks earlier batches kept).
TASKS = Stage("tasks", RawModule, Task, _tasks_batch, needs=_needs, sequential=True,
              pool=_probe_pool)


def run_tasks(ws: Workspace, run: Run, cfg: Config, *, batch_size: int | None = None,
              progress: Callable[[int], None] | None = None, stage: Stage = TASKS
              ) -> dict[str, int]:
    """Build tasks for every pending RawModule of the workspace; returns counts."""
    modules = ws.read(RawModule)
    done = done_module_ids(ws)
    pending = [m for m in modules if m.module_id not in done]
    counts: Counter[str] = Counter(modules=len(modules), skipped=len(modules) - len(pending))
    size = max(1, batch_size or cfg.flows.batch_size)
    with stage.pool(cfg) as pool:
        ctx = StageContext(cfg, cache_dir=str(ws.cache_dir),
                           tasks={t.task_id: t for t in ws.read(Task)}, pool=pool,
                           benchmark_dir=str(ws.root / "benchmarks"))  # fetched indexes
        counts.update(run_batches(stage, pending, ctx, run, size=size, progress=progress))
    return dict(counts)
