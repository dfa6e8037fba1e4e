"""Prefect tasks: one per stage batch, each a thin call of `Stage.run` (pipeline/stage.py); the
sequential stages (ingest, tasks) run whole, on the local executor, in one task each.

A task gets a batch and its `StageContext`, runs the stage and returns its records, rejections
and counts; the flow writes them as batches finish. Retries are for transient failures only (git,
HTTP: `runners.retry_if_transient`) and only for stages that declare `retry_transient`; a verdict
is never re-rolled, so verification tasks have no retries at all.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE
from prefect.futures import PrefectFuture, as_completed

from flows.runners import retry_if_transient
from pipeline.runner import LocalExecutor, StageProgress, write_new
from pipeline.stage import StageContext
from pipeline.stages import load_stages
from pipeline.workspace import Run, Workspace
from schemas import Rejection

# The CLI attaches a terminal handler here; Prefect's run logger carries the same lines to the UI.
progress_log = logging.getLogger("kernelsynth.build")


def say(message: str) -> None:
    """Log to the Prefect run (UI) and to the CLI's progress logger."""
    try:
        get_run_logger().info(message)
    except Exception as exc:  # outside a run context (direct `.fn` calls in tests)
        progress_log.debug("no Prefect run logger (%s)", type(exc).__name__)
    progress_log.info(message)


def open_run(workspace: str, run_id: str) -> tuple[Workspace, Run]:
    ws = Workspace(workspace)
    return ws, ws.new_run(run_id)


class Progress:
    """A Prefect progress artifact (visible on the flow run page), log lines, and the items done
    reported through `pipeline.runner.StageProgress` (the CLI's progress bar).

    `sizes` holds the number of items in each batch, in the order the futures were made.
    """

    def __init__(self, stage: str, sizes: list[int]):
        self.stage, self.total, self.done = stage, len(sizes), 0
        self.sizes = sizes
        self.items = StageProgress(stage, sum(sizes))
        self.artifact = None
        try:
            self.artifact = create_progress_artifact(
                0.0, description=f"{stage}: 0/{self.total} batches")
        except Exception as exc:  # no API (direct calls); progress still goes to the log
            progress_log.debug("no progress artifact for %s (%s)", stage, exc)

    def step(self, note: str, batch: int | None = None) -> None:
        """One batch finished (`batch`: its index, so its items count towards the bar)."""
        self.done += 1
        if batch is not None:
            self.items(self.sizes[batch])
        pct = 100.0 * self.done / max(1, self.total)
        if self.artifact is not None:
            update_progress_artifact(self.artifact, pct,
                                     description=f"{self.stage}: {self.done}/{self.total} batches")
        say(f"{self.stage}: batch {self.done}/{self.total} ({pct:.0f}%) {note}")

    def close(self) -> None:
        self.items.close()


def completed(futures: list[PrefectFuture]) -> Iterator[PrefectFuture]:
    """Futures in the order they finish (Ray futures through `ray.wait`, others via Prefect)."""
    # Prefect's as_completed waits on API state events, which Ray futures do not deliver.
    if not futures or not all(type(f).__name__ == "PrefectRayFuture" for f in futures):
        yield from as_completed(futures)
        return
    import ray

    by_ref = {f.wrapped_future: f for f in futures}
    pending = list(by_ref)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        for ref in ready:
            yield by_ref[ref]


def collect(futures: list[PrefectFuture], progress: Progress, ws: Workspace, run: Run,
            output: type) -> Counter[str]:
    """Write each batch's new keys as soon as its future finishes; count what was written."""
    counts: Counter[str] = Counter({output.TABLE: 0, "rejections": 0, "failed_batches": 0})
    done = {output: ws.done_keys(output), Rejection: ws.done_keys(Rejection)}
    index = {id(f): i for i, f in enumerate(futures)}
    try:
        for fut in completed(futures):
            batch = index[id(fut)]
            try:
                made, rejected, stage_counts = fut.result()
            except Exception as exc:
                counts["failed_batches"] += 1
                say(f"{progress.stage}: a batch failed ({type(exc).__name__}: {exc})")
                progress.step("failed", batch)
                continue
            counts.update(stage_counts)
            counts[output.TABLE] += len(write_new(run, made, done[output], output.KEY))
            counts["rejections"] += len(write_new(run, rejected, done[Rejection], Rejection.KEY))
            progress.step(f"+{len(made) + len(rejected)} records", batch)
    finally:
        progress.close()
    return counts


@task(name="stage-batch", cache_policy=NO_CACHE, task_run_name="{stage}-{label}")
def stage_batch(stage: str, batch: list, ctx: StageContext, stages: str | None,
                label: str = "") -> tuple[list, list[Rejection], Counter[str]]:
    """One batch of `stage`: its records, rejections and counts (the flow writes them)."""
    out = load_stages(stages).stage(stage).run(batch, ctx)
    return out.records, out.rejections, out.counts


# stages that declare `retry_transient` (LLM calls): a network failure runs the batch again
retrying_stage_batch = stage_batch.with_options(retries=2, retry_delay_seconds=[5, 30],
                                                retry_condition_fn=retry_if_transient)


@task(name="compile-batch", cache_policy=NO_CACHE, task_run_name="compile-{label}")
def compile_batch(batch: list, ctx: StageContext, stages: str | None, label: str = "") -> int:
    """Compile-only pass on CPU workers that fills the build cache before the GPU tasks run."""
    return load_stages(stages).compile.run(batch, ctx).counts["compiled"]


@task(name="stage-whole", cache_policy=NO_CACHE, task_run_name="{stage}")
def whole_stage(local: LocalExecutor, stage: str, items: list | Callable[[], Iterable[Any]],
                ctx: StageContext) -> Counter[str]:
    """A sequential stage run whole on the local executor: a source stream (`items` reads it)
    or a list of items in order (a retried stream skips the keys already written)."""
    if callable(items):
        return local.stream(stage, items, ctx)
    return local.sequential(stage, items, ctx)


retrying_whole_stage = whole_stage.with_options(retries=3, retry_delay_seconds=[2, 10, 30],
                                                retry_condition_fn=retry_if_transient)
