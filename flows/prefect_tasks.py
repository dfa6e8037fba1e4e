"""Prefect tasks: one per stage batch, each a thin call of `Stage.run` (pipeline/stage.py); the
two sequential stages (ingest, tasks) run whole, through the runner, in one task each.

A task gets a batch and what the stage needs besides (`StageContext` fields), runs the stage and
returns its `(records, rejections)`; the flow writes them. Retries are for transient failures only (git,
HTTP: `runners.retry_if_transient`); a verdict is never re-rolled, so verification tasks have no
retries at all.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prefect import get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE
from prefect.futures import PrefectFuture, as_completed

from flows.runners import is_transient, retry_if_transient
from flows.stages import load_stages
from pipeline.config import Config
from pipeline.runner import StageProgress, write_new
from pipeline.stage import StageContext, StageOutput, reject
from pipeline.tasks.ingest import run_ingest
from pipeline.tasks.stages import done_module_ids, run_tasks
from pipeline.workspace import Run, Workspace
from schemas import Candidate, RawModule, Rejection, Task, Verdict

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


def collect(futures: list[PrefectFuture], progress: Progress, run: Run,
            done_candidates: set[str] | None = None) -> dict[str, int]:
    """Write each batch's output as soon as its future finishes; count what was written."""
    counts = {"candidates": 0, "rejections": 0, "verdicts": 0, "failed_batches": 0}
    index = {id(f): i for i, f in enumerate(futures)}
    try:
        for fut in completed(futures):
            _collect_one(fut, progress, run, done_candidates, counts, index[id(fut)])
    finally:
        progress.close()
    return counts


def _collect_one(fut: PrefectFuture, progress: Progress, run: Run,
                 done_candidates: set[str] | None, counts: dict[str, int], batch: int) -> None:
    try:
        made, rejected = fut.result()
    except Exception as exc:
        counts["failed_batches"] += 1
        say(f"{progress.stage}: a batch failed ({type(exc).__name__}: {exc})")
        progress.step("failed", batch)
        return
    records = made
    if done_candidates is not None:
        records = write_new(run, made, done_candidates, "candidate_id")
    else:
        run.write(made)
    run.write(rejected)
    for part in (records, rejected):
        if part:
            table = type(part[0]).TABLE
            counts[table] = counts.get(table, 0) + len(part)
    progress.step(f"+{len(made) + len(rejected)} records", batch)


@task(name="ingest-sources", retries=3, retry_delay_seconds=[2, 10, 30],
      retry_condition_fn=retry_if_transient, cache_policy=NO_CACHE)
def ingest_sources(workspace: str, run_id: str, cfg: Config, stages: str | None) -> dict[str, int]:
    """Collect RawModules from the configured sources (git and HTTP failures are retried)."""
    st = load_stages(stages)
    ws, run = open_run(workspace, run_id)
    with StageProgress("ingest", None) as progress:  # sources are discovered as they are read
        return run_ingest(ws, run, cfg, batch_size=cfg.flows.batch_size,
                          progress=lambda _record: progress(1), stage=st.ingest,
                          read=st.read_sources)


@task(name="build-tasks", cache_policy=NO_CACHE)
def build_tasks(workspace: str, run_id: str, cfg: Config, stages: str | None) -> dict[str, int]:
    """RawModules -> curated KernelBench Tasks (the stage skips modules already done)."""
    ws, run = open_run(workspace, run_id)
    done = done_module_ids(ws)
    pending = sum(m not in done for m in ws.read_table(RawModule).column("module_id").to_pylist())
    with StageProgress("tasks", pending) as progress:
        return run_tasks(ws, run, cfg, batch_size=cfg.flows.batch_size, progress=progress,
                         stage=load_stages(stages).tasks)


@task(name="generate-batch", cache_policy=NO_CACHE, task_run_name="generate-{label}",
      retries=2, retry_delay_seconds=[5, 30], retry_condition_fn=retry_if_transient)
def generate_batch(tasks: list[Task], cfg: Config, backend: str, stages: str | None,
                   label: str = "") -> tuple[list[Candidate], list[Rejection]]:
    """First-attempt candidates for one batch of tasks; a generator crash rejects the batch."""
    try:
        out = load_stages(stages).generate.run(tasks, StageContext(cfg, backend=backend))
    except Exception as exc:
        if is_transient(exc):
            raise
        out = StageOutput()
        detail = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        for t in tasks:
            reject(out, "generate", t.task_id, t.task_id, "generator_error", detail)
    return out.records, out.rejections


@task(name="verify-batch", cache_policy=NO_CACHE, task_run_name="verify-{label}")
def verify_batch(tasks: dict[str, Task], candidates: list[Candidate], cfg: Config,
                 cache_dir: str, stages: str | None, label: str = ""
                 ) -> tuple[list[Verdict], list[Rejection]]:
    """Verdicts (and rejections) for one batch of candidates. No retries: a verdict is final."""
    ctx = StageContext(cfg, backend=cfg.verify.backend, cache_dir=cache_dir, tasks=tasks)
    out = load_stages(stages).verify.run(candidates, ctx)
    return out.records, out.rejections


@task(name="compile-batch", cache_policy=NO_CACHE, task_run_name="compile-{label}")
def compile_batch(tasks: dict[str, Task], candidates: list[Candidate], cfg: Config,
                  cache_dir: str, stages: str | None, label: str = "") -> int:
    """Compile-only pass on CPU workers that fills the build cache before the GPU tasks run."""
    ctx = StageContext(cfg, backend=cfg.verify.backend, cache_dir=cache_dir, tasks=tasks)
    return load_stages(stages).compile.run(candidates, ctx).counts["compiled"]


@task(name="mutate-batch", cache_policy=NO_CACHE, task_run_name="mutate-{label}")
def mutate_batch(tasks: list[Task], candidates: list[Candidate], verdicts: list[Verdict],
                 cfg: Config, stages: str | None, label: str = ""
                 ) -> tuple[list[Candidate], list[Rejection]]:
    """Bug-injected variants of verified-correct kernels (failing attempts with a known fix)."""
    out = load_stages(stages).mutate.run(tasks, StageContext(cfg, candidates=candidates,
                                                                verdicts=verdicts))
    return out.records, out.rejections


@task(name="repair-batch", cache_policy=NO_CACHE, task_run_name="repair-{label}",
      retries=2, retry_delay_seconds=[5, 30], retry_condition_fn=retry_if_transient)
def repair_batch(tasks: list[Task], candidates: list[Candidate], verdicts: list[Verdict],
                 cfg: Config, turn: int, stages: str | None, label: str = ""
                 ) -> tuple[list[Candidate], list[Rejection]]:
    """The next repair turn for every failing chain end of one batch of tasks."""
    ctx = StageContext(cfg, candidates=candidates, verdicts=verdicts, turn=turn)
    out = load_stages(stages).repair.run(tasks, ctx)
    return out.records, out.rejections
