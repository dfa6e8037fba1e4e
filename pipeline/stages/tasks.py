"""The tasks stage: RawModules -> curated KernelBench Tasks (extract, then curate).

The plan hands it the modules not yet turned into tasks nor rejected (`pipeline.plan`); batches
run in order on `tasks.workers` sandboxed probe workers shared by all of them (the stage's pool),
and curation dedups each batch against every task kept so far.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from pipeline.config import Config, TasksConfig
from pipeline.stage import Resources, Stage, StageContext, StageOutput, keep_rejections
from pipeline.tasks.curate.curate import curate_tasks
from pipeline.tasks.extract import extract_tasks
from pipeline.tasks.probe.pool import ProbePool
from schemas import RawModule, Task


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
    out = StageOutput(kept, counts=Counter(curated_out=len(dropped)))
    keep_rejections(out, rejections + dropped)
    return out


def _probe_pool(cfg: Config) -> ProbePool:
    return ProbePool(cfg.tasks.workers, cfg.tasks.probe_memory_mb)


# RawModules -> curated Tasks on one probe pool; batches run in order (curation dedups each
# batch against the tasks earlier batches kept).
TASKS = Stage("tasks", RawModule, Task, _tasks_batch, needs=_needs, sequential=True,
              pool=_probe_pool)
