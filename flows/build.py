"""Prefect flows: one per stage, and `build_dataset`, the end-to-end job behind `kernelsynth build`.

Every flow asks `pipeline.runner` what is pending in the workspace (content-hash keys), maps a
Prefect task (flows/prefect_tasks.py, one `Stage.run` each) over batches of `flows.batch_size` records,
and writes each batch's output as one Parquet part as soon as that batch finishes. A run killed at
any point therefore loses at most the batches in flight, and the next run picks up the rest; since
every key is a content hash and readers keep the first record per key, a resumed build reads back
exactly what an uninterrupted one would have written. Ray placement comes from the resources each
stage declares (`Stage.resources`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import flow, task, unmapped
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.futures import PrefectFuture

from flows.prefect_tasks import (
    Progress,
    build_tasks,
    collect,
    compile_batch,
    completed,
    generate_batch,
    ingest_sources,
    mutate_batch,
    open_run,
    progress_log,
    repair_batch,
    say,
    verify_batch,
)
from flows.runners import placed, runner_for
from flows.stages import load_stages
from pipeline.candidates.verify import missing_task
from pipeline.config import Config, load_config
from pipeline.datasets.publish import publishable_tasks
from pipeline.datasets.stats import backend_funnel
from pipeline.runner import (
    batches,
    chains_by_task,
    generate_pending,
    mutation_pending,
    repair_pending,
    task_batches,
    tasks_pending_generation,
    unverified,
    unverified_chain_ends,
)
from pipeline.stage import GPU_BACKENDS, Stage
from pipeline.workspace import Workspace, new_run_id
from schemas import Candidate, RawModule, Task, Verdict, content_hash, dumps

# --- flows ---------------------------------------------------------------------------------------


@flow(name="ingest", validate_parameters=False)
def ingest_flow(workspace: str, run_id: str, cfg: Config, stages: str | None = None
                ) -> dict[str, int]:
    """Sources -> RawModules."""
    counts = ingest_sources(workspace, run_id, cfg, stages)
    say(f"ingest: {_fmt(counts)}")
    return counts


@flow(name="tasks", validate_parameters=False)
def tasks_flow(workspace: str, run_id: str, cfg: Config, stages: str | None = None
               ) -> dict[str, int]:
    """RawModules -> Tasks (extraction, inputs, annotations, curation)."""
    counts = build_tasks(workspace, run_id, cfg, stages)
    say(f"tasks: {_fmt(counts)}")
    return counts


@flow(name="generate", validate_parameters=False)
def generate_flow(workspace: str, run_id: str, cfg: Config, backend: str,
                  stages: str | None = None) -> dict[str, int]:
    """Tasks -> first-attempt Candidates, for tasks not generated yet."""
    ws, run = open_run(workspace, run_id)
    tasks = ws.read(Task)
    pending = tasks_pending_generation(tasks, generate_pending(ws, tasks, backend, cfg.generate))
    groups = batches(pending, cfg.flows.batch_size)
    say(f"generate: {len(pending)} tasks pending ({len(tasks) - len(pending)} done) "
        f"in {len(groups)} batches")
    with placed(load_stages(stages).generate, cfg, backend):
        futures = generate_batch.map(groups, unmapped(cfg), unmapped(backend), unmapped(stages),
                                     label=[f"{i + 1}of{len(groups)}" for i in range(len(groups))])
    counts = collect(list(futures), Progress("generate", [len(g) for g in groups]), run,
                      ws.done_keys(Candidate))
    counts["pending"] = len(pending)
    return counts


@flow(name="verify", validate_parameters=False)
def verify_flow(workspace: str, run_id: str, cfg: Config, backend: str,
                stages: str | None = None) -> dict[str, int]:
    """Candidates without a verdict -> Verdicts, batch by batch."""
    ws, run = open_run(workspace, run_id)
    tasks = {t.task_id: t for t in ws.read(Task)}
    todo = unverified(ws, backend)
    pending = [c for c in todo if c.task_id in tasks]
    orphans = [c for c in todo if c.task_id not in tasks]
    run.write([missing_task(c) for c in orphans])  # recorded, never verified
    counts = verify_pending(ws, run, cfg, backend, tasks, pending, stages, f"verify[{backend}]")
    counts["orphans"] = len(orphans)
    return counts


def verify_pending(ws: Workspace, run: Any, cfg: Config, backend: str, tasks: dict[str, Task],
                      pending: list[Candidate], stages: str | None, name: str) -> dict[str, int]:
    """Verify `pending` in batches on the verify runner; write verdicts as batches finish."""
    groups = batches(pending, cfg.flows.batch_size)
    subsets = [{c.task_id: tasks[c.task_id] for c in g} for g in groups]
    labels = [f"{i + 1}of{len(groups)}" for i in range(len(groups))]
    cache_dir = str(ws.cache_dir)  # the verifier keeps builds/ and baselines/ under it
    say(f"{name}: {len(pending)} candidates pending in {len(groups)} batches")
    if (cfg.flows.runner == "ray" and backend in GPU_BACKENDS and cfg.flows.split_compile
            and groups):
        futures = _compile_then_verify(subsets, groups, cfg, backend, cache_dir, stages, labels)
    else:
        with placed(load_stages(stages).verify, cfg, backend):
            futures = list(verify_batch.map(subsets, groups, unmapped(cfg), unmapped(cache_dir),
                                            unmapped(stages), label=labels))
    counts = collect(futures, Progress(name, [len(g) for g in groups]), run)
    counts["pending"] = len(pending)
    return counts


def _compile_then_verify(subsets: list, groups: list, cfg: Config, backend: str, cache_dir: str,
                         stages: str | None, labels: list[str]) -> list[PrefectFuture]:
    """GPU backends on Ray: compile each batch on CPU workers (filling the shared build cache),
    then verify it on a GPU worker as soon as its own compile is done, so GPUs never wait on nvcc.
    """
    st = load_stages(stages)
    with placed(st.compile, cfg, backend):
        compiles = list(compile_batch.map(subsets, groups, unmapped(cfg), unmapped(cache_dir),
                                          unmapped(stages), label=labels))
    index = {id(f): i for i, f in enumerate(compiles)}
    futures: list[PrefectFuture | None] = [None] * len(compiles)
    for fut in completed(compiles):
        i = index[id(fut)]
        with placed(st.verify, cfg, backend):
            futures[i] = verify_batch.submit(subsets[i], groups[i], cfg, cache_dir, stages,
                                             label=labels[i])
    return [f for f in futures if f is not None]  # in batch order, as `collect` expects


@flow(name="mutate", validate_parameters=False)
def mutate_flow(workspace: str, run_id: str, cfg: Config, backend: str,
                stages: str | None = None) -> dict[str, int]:
    """Verified-correct kernels -> bug-injected candidates whose fix is known (new ones only)."""
    ws, run = open_run(workspace, run_id)
    tasks, by_task, verdicts = chains_by_task(ws, backend)
    todo = mutation_pending(by_task, verdicts)
    groups = list(task_batches(tasks, todo, verdicts, cfg.flows.batch_size))
    say(f"mutate: {len(todo)} tasks with unmutated correct kernels in {len(groups)} batches")
    with placed(load_stages(stages).mutate, cfg, backend):
        futures = mutate_batch.map([g[0] for g in groups], [g[1] for g in groups],
                                   [g[2] for g in groups], unmapped(cfg), unmapped(stages),
                                   label=[f"{i + 1}of{len(groups)}" for i in range(len(groups))])
    counts = collect(list(futures), Progress("mutate", [len(g[0]) for g in groups]), run,
                     ws.done_keys(Candidate))
    counts["pending"] = len(todo)
    return counts


@flow(name="repair", validate_parameters=False)
def repair_flow(workspace: str, run_id: str, cfg: Config, backend: str, turn: int,
                stages: str | None = None) -> dict[str, int]:
    """One repair turn: verifier feedback on failing chain ends -> next attempts (new ones only).

    As in `pipeline.candidates.generate.run_repair`, chain ends still waiting for a verdict are
    verified first, so an unjudged end is never skipped, and every new candidate id is written
    (several samples of one chain end, as buffered dynamic retry makes, are all kept).
    """
    ws, run = open_run(workspace, run_id)
    tasks, by_task, verdicts = chains_by_task(ws, backend)
    ends = unverified_chain_ends([c for cs in by_task.values() for c in cs], verdicts, tasks, turn)
    counts: dict[str, int] = {"candidates": 0, "failed_batches": 0}
    if ends:
        judged = verify_pending(ws, run, cfg, backend, tasks, ends, stages,
                                   f"repair turn {turn}: verify chain ends")
        counts["verified"] = judged.get("verdicts", 0)
        tasks, by_task, verdicts = chains_by_task(ws, backend)
    todo, _ = repair_pending(by_task, verdicts, turn)
    groups = list(task_batches(tasks, todo, verdicts, cfg.flows.batch_size))
    say(f"repair turn {turn}: {len(todo)} tasks with failing chain ends in {len(groups)} batches")
    with placed(load_stages(stages).repair, cfg, backend):
        futures = repair_batch.map([g[0] for g in groups], [g[1] for g in groups],
                                   [g[2] for g in groups], unmapped(cfg), unmapped(turn),
                                   unmapped(stages),
                                   label=[f"t{turn}-{i + 1}of{len(groups)}" for i in range(len(groups))])
    progress = Progress(f"repair turn {turn}", [len(g[0]) for g in groups])
    written = collect(list(futures), progress, run, ws.done_keys(Candidate))
    counts["candidates"] = written["candidates"]
    counts["failed_batches"] = written["failed_batches"]
    counts["rejections"] = written["rejections"]
    counts["pending"] = len(todo)
    return counts


@dataclass
class VersionInfo:
    """The latest published version of a dataset name and the inputs it was built from."""

    name: str
    path: Path
    fingerprint: str | None


def _version_order(path: Path) -> tuple[int, float]:
    digits = path.name[1:]
    return (int(digits) if path.name.startswith("v") and digits.isdigit() else -1,
            path.stat().st_mtime)


def _published_state(ws: Workspace) -> Path:
    # Which inputs each version was built from, so an unchanged re-run can skip publishing.
    return ws.root / "flows" / "published.json"


def latest_version(ws: Workspace, name: str) -> VersionInfo | None:
    """The newest published version of `name` in the workspace (v<number> order)."""
    root = ws.datasets_dir / name
    found = [m.parent for m in root.glob("*/manifest.json")] if root.exists() else []
    if not found:
        return None
    path = max(found, key=_version_order)
    try:
        state = json.loads(_published_state(ws).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        state = {}
    return VersionInfo(path.name, path, state.get(f"{name}/{path.name}"))


def _remember(ws: Workspace, name: str, version: str, fingerprint: str) -> None:
    path = _published_state(ws)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        state = {}
    state[f"{name}/{version}"] = fingerprint
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1, sort_keys=True), encoding="utf-8")
    tmp.replace(path)


def inputs_fingerprint(ws: Workspace, cfg: Config) -> str:
    """Content hash of everything a version is built from: record keys and the data config."""
    parts = []
    for cls in (Task, Candidate, Verdict):
        keys = ws.read_table(cls).column(cls.KEY).to_pylist()
        parts.append(f"{cls.TABLE}:" + ",".join(sorted(keys)))
    data_cfg = cfg.model_dump(mode="json", include={"select", "publish", "generate", "verify",
                                                    "repair"})
    return content_hash(*parts, dumps(data_cfg))


def workspace_lineage(ws: Workspace) -> dict[str, Any]:
    """What a version's manifest records about its inputs: commits, verifiers, devices, runs."""
    con = ws.duckdb(["raw_modules", "verdicts"])
    commits = [{"repo_url": r, "commit": c} for r, c in con.execute(
        "select distinct repo_url, commit from raw_modules where commit <> '' "
        "order by 1, 2").fetchall()]
    verifiers = [v for (v,) in con.execute(
        "select distinct verifier_version from verdicts where verifier_version <> '' "
        "order by 1").fetchall()]
    devices = [d for (d,) in con.execute(
        "select distinct device from verdicts where device <> '' order by 1").fetchall()]
    return {"source_commits": commits, "verifier_versions": verifiers, "devices": devices,
            "runs": ws.runs()}


@task(name="publish-version", cache_policy=NO_CACHE)
def publish_version_task(workspace: str, run_id: str, cfg: Config, stages: str | None,
                         lineage: dict) -> str:
    """Select, build the dataset configs and publish one version; returns its folder."""
    st = load_stages(stages)
    ws = Workspace(workspace)
    tasks, cands, verdicts = publishable_tasks(ws, cfg, run_id), ws.read(Candidate), ws.read(Verdict)
    selected = st.select(cands, verdicts, cfg.select.k, cfg.select.diversity_weight, cfg.select.seed)
    tables = st.build_datasets(tasks, cands, verdicts, list(selected), cfg)
    return str(st.publish(ws, tables, cfg, lineage))


@flow(name="publish", validate_parameters=False)
def publish_flow(workspace: str, run_id: str, cfg: Config, stages: str | None = None,
                 always_publish: bool = False) -> dict[str, Any]:
    """Workspace -> a new dataset version (parent: the latest), unless nothing changed."""
    ws = Workspace(workspace)
    fingerprint = inputs_fingerprint(ws, cfg)
    latest = latest_version(ws, cfg.publish.name)
    if latest is not None and not always_publish and latest.fingerprint == fingerprint:
        say(f"publish: no new data since {latest.name}; keeping {latest.path}")
        return {"published": False, "version": latest.name, "path": str(latest.path),
                "parent": None}
    path = Path(publish_version_task(workspace, run_id, cfg, stages, workspace_lineage(ws)))
    _remember(ws, cfg.publish.name, path.name, fingerprint)
    parent = latest.name if latest else None
    say(f"publish: new version {path.name} at {path} (parent {parent})")
    return {"published": True, "version": path.name, "path": str(path), "parent": parent}


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
    """The main job: sources -> tasks -> candidates -> verdicts -> repairs -> a dataset version."""
    cfg = load_config(config, workspace)
    if runner is not None:
        cfg = cfg.model_copy(update={"flows": cfg.flows.model_copy(update={"runner": runner})})
    ws = Workspace(cfg.workspace)
    root = str(ws.root)
    st = load_stages(stages)
    run_id = new_run_id()
    backend = st.resolve_backend(cfg.generate.backend if cfg.generate.backend != "auto"
                                 else cfg.verify.backend)
    cfg = cfg.model_copy(update={"verify": cfg.verify.model_copy(update={"backend": backend}),
                                 "generate": cfg.generate.model_copy(update={"backend": backend})})
    say(f"build {run_id}: workspace {root}, backend {backend}, runner {cfg.flows.runner}")
    stage_rows: list[dict[str, Any]] = []

    def stage(name: str, fn: Any, runs: Stage, **kw: Any) -> dict[str, Any]:
        t0 = time.perf_counter()
        runner_obj = runner_for(runs, cfg, backend)  # from what the stage declares
        sub = fn.with_options(task_runner=runner_obj) if runner_obj is not None else fn
        counts = sub(root, run_id, cfg, stages=stages, **kw)
        row = {"stage": name, "seconds": round(time.perf_counter() - t0, 2), **counts}
        stage_rows.append(row)
        return counts

    with ray_session(cfg):
        stage("ingest", ingest_flow, st.ingest)
        stage("tasks", tasks_flow, st.tasks)
        stage("generate", generate_flow, st.generate, backend=backend)
        stage("verify", verify_flow, st.verify, backend=backend)
        for r in range(cfg.generate.mutation_rounds if cfg.generate.mutations_per_kernel else 0):
            # a later round retries the kernels whose mutants all verified correct
            suffix = "" if r == 0 else f":{r + 1}"
            made = stage(f"mutate{suffix}", mutate_flow, st.mutate, backend=backend)
            if r and not made.get("candidates"):
                break
            stage(f"verify:mutants{suffix}", verify_flow, st.verify, backend=backend)
        for turn in range(1, cfg.repair.turns + 1):
            stage(f"repair:{turn}", repair_flow, st.repair, backend=backend, turn=turn)
            stage(f"verify:repair{turn}", verify_flow, st.verify, backend=backend)
    t0 = time.perf_counter()
    pub = publish_flow(root, run_id, cfg, stages=stages,
                       always_publish=cfg.flows.always_publish if always_publish is None
                       else always_publish)
    stage_rows.append({"stage": "publish", "seconds": round(time.perf_counter() - t0, 2),
                       "published": int(pub["published"])})
    summary = {"run_id": run_id, "workspace": root, "backend": backend,
               "runner": cfg.flows.runner, "stages": stage_rows, "funnel": funnel(ws, backend),
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


__all__ = [
    "build_dataset", "generate_flow", "ingest_flow", "mutate_flow", "publish_flow",
    "repair_flow", "tasks_flow", "verify_flow",
]
