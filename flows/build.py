"""Prefect flows: `build_dataset`, the end-to-end job behind `kernelsynth build`, runs the one plan
(`pipeline.plan`) on a `PrefectExecutor`.

Each step of the plan is a Prefect subflow (`step_flow`); each stage run inside it maps a Prefect
task (flows/prefect_tasks.py, one `Stage.run` each) over the batches the plan made, on the task
runner the stage's declared resources pick (`runners.runner_for`; Ray placement from
`Stage.resources`), and writes each batch's output as one Parquet part as soon as that batch
finishes. A run killed at any point therefore loses at most the batches in flight, and the next
run picks up the rest; since every key is a content hash and readers keep the first record per
key, a resumed build reads back exactly what an uninterrupted one would have written. What is
pending, and in which order, is the plan's alone: the step commands run the same steps.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from prefect import flow, unmapped
from prefect.artifacts import create_markdown_artifact
from prefect.futures import PrefectFuture
from prefect.task_runners import TaskRunner

from flows.prefect_tasks import (
    Progress,
    collect,
    compile_batch,
    completed,
    progress_log,
    retrying_stage_batch,
    retrying_whole_stage,
    say,
    stage_batch,
    whole_stage,
)
from flows.runners import placed, runner_for
from pipeline.config import Config, load_config
from pipeline.datasets.stats import backend_funnel
from pipeline.plan import STEPS, pin_backend, publish_step, run_step
from pipeline.runner import LocalExecutor
from pipeline.stage import GPU_BACKENDS, StageContext
from pipeline.stages import StageSet, load_stages
from pipeline.workspace import Workspace, new_run_id
from schemas import Candidate, RawModule, Task, Verdict


@dataclass
class PrefectExecutor:
    """The plan's executor on Prefect: batches as Prefect tasks on the stage's task runner.

    The sequential stages (ingest, tasks) run whole in one Prefect task on the local executor;
    both executors append their rows (label, seconds, counts) to one `rows` list.
    """

    ws: Workspace
    cfg: Config
    backend: str
    stages: StageSet
    spec: str | None  # the StageSet's import path, for tasks that run in other processes
    run_id: str
    local: LocalExecutor = field(init=False)

    def __post_init__(self) -> None:
        self.local = LocalExecutor(self.ws, self.cfg, self.backend, self.stages,
                                   self.ws.new_run(self.run_id))

    @property
    def rows(self) -> list[dict[str, Any]]:
        return self.local.rows

    def write(self, records: list) -> int:
        return self.local.write(records)

    def stream(self, stage: str, read: Callable[[], Iterable[Any]], ctx: StageContext
               ) -> Counter[str]:
        return self._whole(stage, read, ctx)

    def sequential(self, stage: str, items: list, ctx: StageContext) -> Counter[str]:
        return self._whole(stage, items, ctx)

    def _whole(self, stage: str, items: Any, ctx: StageContext) -> Counter[str]:
        # one task in the step's own process: its batches depend on earlier ones
        st = self.stages.stage(stage)
        return (retrying_whole_stage if st.retry_transient else whole_stage)(
            self.local, stage, items, ctx)

    def map(self, label: str, stage: str, groups: list[list], contexts: list[StageContext]
            ) -> Counter[str]:
        """Submit every batch to the stage's task runner; write each output as it finishes."""
        st, t0 = self.stages.stage(stage), time.perf_counter()
        labels = [f"{i + 1}of{len(groups)}" for i in range(len(groups))]
        say(f"{label}: {sum(len(g) for g in groups)} items in {len(groups)} batches")
        with runner_for(st, self.cfg, self.backend) as runner:
            if (stage == "verify" and self.cfg.flows.runner == "ray"
                    and self.backend in GPU_BACKENDS and self.cfg.flows.split_compile and groups):
                futures = self._compile_then_verify(runner, groups, contexts, labels)
            else:
                fn = retrying_stage_batch if st.retry_transient else stage_batch
                with placed(st, self.cfg, self.backend):
                    futures = list(runner.map(fn, {
                        "stage": unmapped(stage), "batch": groups, "ctx": contexts,
                        "stages": unmapped(self.spec), "label": labels}))
            counts = collect(futures, Progress(label, [len(g) for g in groups]), self.ws,
                             self.local.run, st.output)
        self.rows.append({"stage": label, "seconds": round(time.perf_counter() - t0, 2),
                          "items": sum(len(g) for g in groups), **counts})
        return counts

    def _compile_then_verify(self, runner: TaskRunner, groups: list[list],
                             contexts: list[StageContext], labels: list[str]
                             ) -> list[PrefectFuture]:
        """GPU backends on Ray: compile each batch on CPU workers (filling the shared build
        cache), then verify it on a GPU worker as soon as its own compile is done, so GPUs never
        wait on nvcc."""
        with placed(self.stages.compile, self.cfg, self.backend):
            compiles = list(runner.map(compile_batch, {
                "batch": groups, "ctx": contexts, "stages": unmapped(self.spec),
                "label": labels}))
        index = {id(f): i for i, f in enumerate(compiles)}
        futures: list[PrefectFuture | None] = [None] * len(compiles)
        for fut in completed(compiles):
            i = index[id(fut)]
            with placed(self.stages.verify, self.cfg, self.backend):
                futures[i] = runner.submit(stage_batch, {
                    "stage": "verify", "batch": groups[i], "ctx": contexts[i],
                    "stages": self.spec, "label": labels[i]})
        return [f for f in futures if f is not None]  # in batch order, as `collect` expects


def step_flow(step: str, ex: PrefectExecutor) -> dict[str, int]:
    """One step of the plan as a Prefect subflow (the executor travels in its closure, so
    records never become flow-run parameters)."""

    @flow(name=step, validate_parameters=False)
    def one_step() -> dict[str, int]:
        counts = dict(run_step(ex, step))
        say(f"{step}: {_fmt(counts)}")
        return counts

    return one_step()


# --- the main job ----------------------------------------------------------------------------------


def _fmt(counts: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in counts.items())


def funnel(ws: Workspace, backend: str) -> dict[str, Any]:
    """Counts through the pipeline and pass rates, over the whole workspace, for `backend`."""
    return backend_funnel(ws.read_table(RawModule).num_rows, ws.read(Task), ws.read(Candidate),
                          ws.read(Verdict), backend)


@flow(name="build_dataset", validate_parameters=False)
def build_dataset(workspace: str = "./ks-data", config: str | None = None,
                  always_publish: bool | None = None, runner: str | None = None,
                  stages: str | None = None) -> dict[str, Any]:
    """The main job: every step of the plan, in its order, then a dataset version."""
    cfg = load_config(config, workspace)
    if runner is not None:
        cfg = cfg.model_copy(update={"flows": cfg.flows.model_copy(update={"runner": runner})})
    ws = Workspace(cfg.workspace)
    st = load_stages(stages)
    cfg, backend = pin_backend(cfg, st)
    ex = PrefectExecutor(ws, cfg, backend, st, stages, new_run_id())
    say(f"build {ex.run_id}: workspace {ws.root}, backend {backend}, runner {cfg.flows.runner}")
    with ray_session(cfg):
        for step in STEPS[:-1]:
            step_flow(step, ex)
    t0 = time.perf_counter()
    pub = publish_step(ex, always=always_publish)
    say(f"publish: {'new version' if pub['published'] else 'no new data; kept'} "
        f"{pub['version']} at {pub['path']}")
    ex.rows.append({"stage": "publish", "seconds": round(time.perf_counter() - t0, 2),
                    "published": int(pub["published"])})
    summary = {"run_id": ex.run_id, "workspace": str(ws.root), "backend": backend,
               "runner": cfg.flows.runner, "stages": ex.rows, "funnel": funnel(ws, backend),
               **pub}
    _summary_artifact(summary)
    return summary


class ray_session:
    """One Ray instance for the whole build (each RayTaskRunner reuses it) when runner is ray."""

    def __init__(self, cfg: Config):
        self.cfg, self.owned = cfg, False

    def __enter__(self) -> ray_session:
        if self.cfg.flows.runner == "ray":
            import ray

            if not ray.is_initialized():
                kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                                      "namespace": "prefect"}
                if self.cfg.flows.ray_num_cpus is not None:
                    kw["num_cpus"] = self.cfg.flows.ray_num_cpus
                if self.cfg.flows.ray_num_gpus is not None:
                    kw["num_gpus"] = self.cfg.flows.ray_num_gpus
                if self.cfg.flows.ray_address is not None:
                    kw = {"address": self.cfg.flows.ray_address, "namespace": "prefect"}
                ray.init(**kw)
                self.owned = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self.owned:
            import ray

            ray.shutdown()


def _summary_artifact(summary: dict[str, Any]) -> None:
    lines = ["# kernelsynth build", "", f"version: `{summary['version']}` "
             f"({'published' if summary['published'] else 'unchanged'}) at `{summary['path']}`",
             "", "| stage | seconds | counts |", "| --- | --- | --- |"]
    for row in summary["stages"]:
        extra = {k: v for k, v in row.items() if k not in ("stage", "seconds")}
        lines.append(f"| {row['stage']} | {row['seconds']} | {_fmt(extra)} |")
    lines += ["", "| funnel | value |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in summary["funnel"].items()]
    try:
        create_markdown_artifact("\n".join(lines), key="build-summary",
                                 description="funnel and stage times")
    except Exception as exc:  # an artifact is a convenience; the summary is also returned
        progress_log.debug("no summary artifact (%s)", exc)


__all__ = ["PrefectExecutor", "build_dataset", "ray_session", "step_flow"]
