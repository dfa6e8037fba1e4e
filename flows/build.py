"""Prefect flows: one per stage, and `build_dataset`, the end-to-end job behind `kernelsynth build`.

Every flow reads its inputs from the workspace, skips what is already done there (content-hash
keys: `Workspace.done_keys`), maps a Prefect task over batches of `flows.batch_size` records, and
writes each batch's output as one Parquet part as soon as that batch finishes. A run killed at any
point therefore loses at most the batches in flight, and the next run picks up the rest; since
every key is a content hash and readers keep the first record per key, a resumed build reads back
exactly what an uninterrupted one would have written.

Retries are for transient failures only (git, HTTP: `runners.retry_if_transient`); a verdict is
never re-rolled, so verification tasks have no retries at all.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from prefect import flow, get_run_logger, task, unmapped
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    update_progress_artifact,
)
from prefect.cache_policies import NO_CACHE
from prefect.futures import PrefectFuture, as_completed

from flows.runners import (
    GPU_BACKENDS,
    compile_resources,
    cpu_runner,
    io_runner,
    is_transient,
    retry_if_transient,
    verify_resources,
    verify_runner,
)
from flows.stages import load_stages
from pipeline.config import Config, load_config
from pipeline.workspace import Run, Workspace, new_run_id
from schemas import Candidate, Rejection, Task, Verdict, content_hash, dumps

T = TypeVar("T")

# The CLI attaches a terminal handler here; Prefect's run logger carries the same lines to the UI.
progress_log = logging.getLogger("kernelsynth.build")

CORRECT = ("correct_slow", "correct_fast")
NOT_COMPILED = ("format_error", "static_reject", "compile_error")


def _say(message: str) -> None:
    """Log to the Prefect run (UI) and to the CLI's progress logger."""
    try:
        get_run_logger().info(message)
    except Exception as exc:  # outside a run context (direct `.fn` calls in tests)
        progress_log.debug("no Prefect run logger (%s)", type(exc).__name__)
    progress_log.info(message)


def batches(items: list[T], size: int) -> list[list[T]]:
    """Consecutive batches of at most `size` items (the unit of work and of writing)."""
    size = max(1, size)
    return [items[i:i + size] for i in range(0, len(items), size)]


def _open_run(workspace: str, run_id: str) -> tuple[Workspace, Run]:
    ws = Workspace(workspace)
    return ws, ws.new_run(run_id)


def _rejections(stage: str, items: Iterable[Any], key: str, reason: str,
                exc: BaseException) -> list[Rejection]:
    detail = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
    return [Rejection.make(stage, getattr(it, key), getattr(it, "task_id", ""), reason, detail)
            for it in items]


class _Progress:
    """A Prefect progress artifact (visible on the flow run page) plus log lines."""

    def __init__(self, stage: str, total: int):
        self.stage, self.total, self.done = stage, total, 0
        self.artifact = None
        try:
            self.artifact = create_progress_artifact(
                0.0, description=f"{stage}: 0/{total} batches")
        except Exception as exc:  # no API (direct calls); progress still goes to the log
            progress_log.debug("no progress artifact for %s (%s)", stage, exc)

    def step(self, note: str) -> None:
        self.done += 1
        pct = 100.0 * self.done / max(1, self.total)
        if self.artifact is not None:
            update_progress_artifact(self.artifact, pct,
                                     description=f"{self.stage}: {self.done}/{self.total} batches")
        _say(f"{self.stage}: batch {self.done}/{self.total} ({pct:.0f}%) {note}")


# --- tasks ---------------------------------------------------------------------------------------


@task(name="ingest-sources", retries=3, retry_delay_seconds=[2, 10, 30],
      retry_condition_fn=retry_if_transient, cache_policy=NO_CACHE)
def ingest_sources(workspace: str, run_id: str, cfg: Config, stages: str | None) -> dict[str, int]:
    """Collect RawModules from the configured sources (git and HTTP failures are retried)."""
    ws, run = _open_run(workspace, run_id)
    return dict(load_stages(stages).ingest(ws, run, cfg))


@task(name="build-tasks", cache_policy=NO_CACHE)
def build_tasks(workspace: str, run_id: str, cfg: Config, stages: str | None) -> dict[str, int]:
    """RawModules -> curated KernelBench Tasks (the stage skips modules already done)."""
    ws, run = _open_run(workspace, run_id)
    return dict(load_stages(stages).tasks(ws, run, cfg))


@task(name="generate-batch", cache_policy=NO_CACHE, task_run_name="generate-{label}",
      retries=2, retry_delay_seconds=[5, 30], retry_condition_fn=retry_if_transient)
def generate_batch(tasks: list[Task], cfg: Config, backend: str, stages: str | None,
                   label: str = "") -> tuple[list[Candidate], list[Rejection]]:
    """First-attempt candidates for one batch of tasks."""
    try:
        cands, rejs = load_stages(stages).generate(tasks, cfg.generate, backend)
    except Exception as exc:
        if is_transient(exc):
            raise
        return [], _rejections("generate", tasks, "task_id", "generator_error", exc)
    return list(cands), list(rejs)


@task(name="verify-batch", cache_policy=NO_CACHE, task_run_name="verify-{label}")
def verify_batch(tasks: dict[str, Task], candidates: list[Candidate], cfg: Config,
                 cache_dir: str, stages: str | None, label: str = ""
                 ) -> tuple[list[Verdict], list[Rejection]]:
    """Verdicts (and rejections) for one batch of candidates. No retries: a verdict is final."""
    made = load_stages(stages).verify(tasks, candidates, cfg.verify, Path(cache_dir))
    if isinstance(made, tuple):  # (verdicts, rejections)
        return list(made[0]), list(made[1])
    return list(made), []


@task(name="compile-batch", cache_policy=NO_CACHE, task_run_name="compile-{label}")
def compile_batch(tasks: dict[str, Task], candidates: list[Candidate], cfg: Config,
                  cache_dir: str, stages: str | None, label: str = "") -> int:
    """Compile-only pass on CPU workers that fills the build cache before the GPU tasks run."""
    vcfg = cfg.verify.model_copy(update={"compile_only": True})
    return len(load_stages(stages).verify(tasks, candidates, vcfg, Path(cache_dir)))


@task(name="mutate-batch", cache_policy=NO_CACHE, task_run_name="mutate-{label}")
def mutate_batch(tasks: list[Task], candidates: list[Candidate], verdicts: list[Verdict],
                 cfg: Config, stages: str | None, label: str = "") -> list[Candidate]:
    """Bug-injected variants of verified-correct kernels (failing attempts with a known fix)."""
    return list(load_stages(stages).mutate(tasks, candidates, verdicts, cfg.generate))


@task(name="repair-batch", cache_policy=NO_CACHE, task_run_name="repair-{label}",
      retries=2, retry_delay_seconds=[5, 30], retry_condition_fn=retry_if_transient)
def repair_batch(tasks: list[Task], candidates: list[Candidate], verdicts: list[Verdict],
                 cfg: Config, turn: int, stages: str | None, label: str = ""
                 ) -> tuple[list[Candidate], list[Rejection]]:
    """The next repair turn for every failing chain end of one batch of tasks."""
    made = load_stages(stages).repair(tasks, candidates, verdicts, cfg, turn)
    if isinstance(made, tuple):
        return list(made[0]), list(made[1])
    return list(made), []


# --- flows ---------------------------------------------------------------------------------------


@flow(name="ingest", validate_parameters=False)
def ingest_flow(workspace: str, run_id: str, cfg: Config, stages: str | None = None
                ) -> dict[str, int]:
    """Sources -> RawModules."""
    counts = ingest_sources(workspace, run_id, cfg, stages)
    _say(f"ingest: {_fmt(counts)}")
    return counts


@flow(name="tasks", validate_parameters=False)
def tasks_flow(workspace: str, run_id: str, cfg: Config, stages: str | None = None
               ) -> dict[str, int]:
    """RawModules -> Tasks (extraction, inputs, annotations, curation)."""
    counts = build_tasks(workspace, run_id, cfg, stages)
    _say(f"tasks: {_fmt(counts)}")
    return counts


GENERATOR_PREFIX = {"template": "template:", "openai": "llm:", "hf": "hf:"}


def generated_task_ids(ws: Workspace, backend: str, generators: list[str]) -> set[str]:
    """Tasks every configured generator has answered on `backend` (a candidate or a rejection).

    A rejection for an unreachable LLM does not count: the next run asks again.
    """
    cands = ws.read_table(Candidate).select(["task_id", "backend", "turn", "generator"]).to_pylist()
    rejs = ws.read_table(Rejection).select(["stage", "item_id", "reason"]).to_pylist()
    rejected = {r["item_id"] for r in rejs
                if r["stage"] == "generate" and not r["reason"].startswith("llm")}
    prefixes = [GENERATOR_PREFIX[g] for g in generators if g in GENERATOR_PREFIX]
    have: dict[str, set[str]] = {}
    for c in cands:
        if c["backend"] == backend and c["turn"] == 0:
            have.setdefault(c["task_id"], set()).update(
                p for p in prefixes if c["generator"].startswith(p))
    task_ids = set(have) | rejected
    return {t for t in task_ids
            if all(p in have.get(t, ()) or (t in rejected and p == "template:") for p in prefixes)}


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


def _collect(futures: list[PrefectFuture], progress: _Progress, run: Run,
             done_candidates: set[str] | None = None) -> dict[str, int]:
    """Write each batch's records as soon as its future finishes; count what was written."""
    counts = {"candidates": 0, "rejections": 0, "verdicts": 0, "failed_batches": 0}
    for fut in completed(futures):
        try:
            result = fut.result()
        except Exception as exc:
            counts["failed_batches"] += 1
            _say(f"{progress.stage}: a batch failed ({type(exc).__name__}: {exc})")
            progress.step("failed")
            continue
        parts = result if isinstance(result, tuple) else (result,)
        for records in parts:
            if done_candidates is not None and records and isinstance(records[0], Candidate):
                records = [c for c in records if c.candidate_id not in done_candidates]
                done_candidates.update(c.candidate_id for c in records)
            if records:
                run.write(records)
                counts[type(records[0]).TABLE] = counts.get(type(records[0]).TABLE, 0) + len(
                    records)
        progress.step(f"+{sum(len(p) for p in parts)} records")
    return counts


@flow(name="generate", validate_parameters=False)
def generate_flow(workspace: str, run_id: str, cfg: Config, backend: str,
                  stages: str | None = None) -> dict[str, int]:
    """Tasks -> first-attempt Candidates, for tasks not generated yet."""
    ws, run = _open_run(workspace, run_id)
    done = generated_task_ids(ws, backend, cfg.generate.generators)
    pending = [t for t in ws.read(Task) if t.task_id not in done]
    groups = batches(pending, cfg.flows.batch_size)
    _say(f"generate: {len(pending)} tasks pending ({len(done)} done) in {len(groups)} batches")
    futures = generate_batch.map(groups, unmapped(cfg), unmapped(backend), unmapped(stages),
                                 label=[f"{i + 1}of{len(groups)}" for i in range(len(groups))])
    counts = _collect(list(futures), _Progress("generate", len(groups)), run,
                      ws.done_keys(Candidate))
    counts["pending"] = len(pending)
    return counts


@flow(name="verify", validate_parameters=False)
def verify_flow(workspace: str, run_id: str, cfg: Config, backend: str,
                stages: str | None = None) -> dict[str, int]:
    """Candidates without a verdict -> Verdicts, batch by batch."""
    ws, run = _open_run(workspace, run_id)
    done = ws.done_keys(Verdict)
    tasks = {t.task_id: t for t in ws.read(Task)}
    pending, orphans = [], []
    for c in ws.read(Candidate):
        if c.backend != backend or c.candidate_id in done:
            continue
        (pending if c.task_id in tasks else orphans).append(c)
    if orphans:  # recorded, never verified against a missing reference
        run.write([Rejection.make("verify", c.candidate_id, c.task_id, "missing_task",
                                  f"candidate {c.candidate_id}: task {c.task_id} not in workspace")
                   for c in orphans])
    groups = batches(pending, cfg.flows.batch_size)
    subsets = [{c.task_id: tasks[c.task_id] for c in g} for g in groups]
    labels = [f"{i + 1}of{len(groups)}" for i in range(len(groups))]
    cache_dir = str(ws.cache_dir)  # the verifier keeps builds/ and baselines/ under it
    _say(f"verify[{backend}]: {len(pending)} candidates pending ({len(done)} done) "
         f"in {len(groups)} batches")
    if cfg.flows.runner != "ray":
        futures = list(verify_batch.map(subsets, groups, unmapped(cfg), unmapped(cache_dir),
                                        unmapped(stages), label=labels))
    elif backend in GPU_BACKENDS and cfg.flows.split_compile and groups:
        futures = _compile_then_verify(subsets, groups, cfg, backend, cache_dir, stages, labels)
    else:
        from prefect_ray.context import remote_options

        with remote_options(**verify_resources(cfg, backend)):
            futures = list(verify_batch.map(subsets, groups, unmapped(cfg), unmapped(cache_dir),
                                            unmapped(stages), label=labels))
    counts = _collect(futures, _Progress(f"verify[{backend}]", len(groups)), run)
    counts["pending"] = len(pending)
    counts["orphans"] = len(orphans)
    return counts


def _compile_then_verify(subsets: list, groups: list, cfg: Config, backend: str, cache_dir: str,
                         stages: str | None, labels: list[str]) -> list[PrefectFuture]:
    """GPU backends on Ray: compile each batch on CPU workers (filling the shared build cache),
    then verify it on a GPU worker as soon as its own compile is done, so GPUs never wait on nvcc.
    """
    from prefect_ray.context import remote_options

    with remote_options(**compile_resources(cfg)):
        compiles = list(compile_batch.map(subsets, groups, unmapped(cfg), unmapped(cache_dir),
                                          unmapped(stages), label=labels))
    index = {id(f): i for i, f in enumerate(compiles)}
    futures = []
    for fut in completed(compiles):
        i = index[id(fut)]
        with remote_options(**verify_resources(cfg, backend)):
            futures.append(verify_batch.submit(subsets[i], groups[i], cfg, cache_dir, stages,
                                               label=labels[i]))
    return futures


def _chains_by_task(ws: Workspace, backend: str, task_ids: set[str] | None = None
                    ) -> tuple[dict[str, Task], dict[str, list[Candidate]], list[Verdict]]:
    tasks = {t.task_id: t for t in ws.read(Task) if task_ids is None or t.task_id in task_ids}
    by_task: dict[str, list[Candidate]] = {}
    for c in ws.read(Candidate):
        if c.backend == backend and c.task_id in tasks:
            by_task.setdefault(c.task_id, []).append(c)
    return tasks, by_task, ws.read(Verdict)


def _task_batches(tasks: dict[str, Task], by_task: dict[str, list[Candidate]],
                  verdicts: list[Verdict], size: int
                  ) -> Iterator[tuple[list[Task], list[Candidate], list[Verdict]]]:
    """Batches of whole tasks (all their candidates and verdicts), about `size` candidates each."""
    vmap = {v.candidate_id: v for v in verdicts}
    batch_t: list[Task] = []
    batch_c: list[Candidate] = []
    for tid in sorted(by_task):
        batch_t.append(tasks[tid])
        batch_c.extend(by_task[tid])
        if len(batch_c) >= size:
            yield batch_t, batch_c, [vmap[c.candidate_id] for c in batch_c
                                     if c.candidate_id in vmap]
            batch_t, batch_c = [], []
    if batch_t:
        yield batch_t, batch_c, [vmap[c.candidate_id] for c in batch_c if c.candidate_id in vmap]


@flow(name="mutate", validate_parameters=False)
def mutate_flow(workspace: str, run_id: str, cfg: Config, backend: str,
                stages: str | None = None) -> dict[str, int]:
    """Verified-correct kernels -> bug-injected candidates whose fix is known (new ones only)."""
    ws, run = _open_run(workspace, run_id)
    tasks, by_task, verdicts = _chains_by_task(ws, backend)
    correct = {v.candidate_id for v in verdicts if v.status in CORRECT}
    # Only tasks with a correct kernel that has not been mutated yet.
    mutated = {c.parent_id for cs in by_task.values() for c in cs
               if c.generator.startswith("mutate:")}
    todo = {tid: cs for tid, cs in by_task.items()
            if any(c.candidate_id in correct and c.candidate_id not in mutated
                   and not c.generator.startswith(("mutate:", "repair:")) for c in cs)}
    groups = list(_task_batches(tasks, todo, verdicts, cfg.flows.batch_size))
    _say(f"mutate: {len(todo)} tasks with unmutated correct kernels in {len(groups)} batches")
    futures = mutate_batch.map([g[0] for g in groups], [g[1] for g in groups],
                               [g[2] for g in groups], unmapped(cfg), unmapped(stages),
                               label=[f"{i + 1}of{len(groups)}" for i in range(len(groups))])
    counts = _collect(list(futures), _Progress("mutate", len(groups)), run,
                      ws.done_keys(Candidate))
    counts["pending"] = len(todo)
    return counts


@flow(name="repair", validate_parameters=False)
def repair_flow(workspace: str, run_id: str, cfg: Config, backend: str, turn: int,
                stages: str | None = None) -> dict[str, int]:
    """One repair turn: verifier feedback on failing chain ends -> next attempts (new ones only)."""
    ws, run = _open_run(workspace, run_id)
    tasks, by_task, verdicts = _chains_by_task(ws, backend)
    vmap = {v.candidate_id: v for v in verdicts}
    has_child = {c.parent_id for cs in by_task.values() for c in cs if c.parent_id}
    # A chain end at turn-1 that failed and has no follow-up yet; its task goes in a batch.
    todo = {tid: cs for tid, cs in by_task.items()
            if any(c.turn == turn - 1 and c.candidate_id in vmap
                   and vmap[c.candidate_id].status not in CORRECT
                   and c.candidate_id not in has_child for c in cs)}
    groups = list(_task_batches(tasks, todo, verdicts, cfg.flows.batch_size))
    _say(f"repair turn {turn}: {len(todo)} tasks with failing chain ends in {len(groups)} batches")
    futures = repair_batch.map([g[0] for g in groups], [g[1] for g in groups],
                               [g[2] for g in groups], unmapped(cfg), unmapped(turn),
                               unmapped(stages),
                               label=[f"t{turn}-{i + 1}of{len(groups)}" for i in range(len(groups))])
    done = ws.done_keys(Candidate)
    # A chain end answered in an earlier, interrupted run keeps its first answer.
    done_parents = set(has_child)
    counts = {"candidates": 0, "failed_batches": 0}
    progress = _Progress(f"repair turn {turn}", len(groups))
    for fut in completed(list(futures)):
        try:
            new, rejected = fut.result()
        except Exception as exc:
            counts["failed_batches"] += 1
            progress.step(f"failed ({type(exc).__name__}: {exc})")
            continue
        fresh = []
        for c in new:
            if c.candidate_id in done or (c.parent_id and c.parent_id in done_parents):
                continue
            done.add(c.candidate_id)
            if c.parent_id:
                done_parents.add(c.parent_id)
            fresh.append(c)
        run.write(fresh)
        run.write(rejected)
        counts["candidates"] += len(fresh)
        counts["rejections"] = counts.get("rejections", 0) + len(rejected)
        progress.step(f"+{len(fresh)} candidates")
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
    tasks, cands, verdicts = ws.read(Task), ws.read(Candidate), ws.read(Verdict)
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
        _say(f"publish: no new data since {latest.name}; keeping {latest.path}")
        return {"published": False, "version": latest.name, "path": str(latest.path),
                "parent": None}
    path = Path(publish_version_task(workspace, run_id, cfg, stages, workspace_lineage(ws)))
    _remember(ws, cfg.publish.name, path.name, fingerprint)
    parent = latest.name if latest else None
    _say(f"publish: new version {path.name} at {path} (parent {parent})")
    return {"published": True, "version": path.name, "path": str(path), "parent": parent}


# --- the main job ----------------------------------------------------------------------------------


def _fmt(counts: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in counts.items())


def funnel(ws: Workspace, backend: str) -> dict[str, Any]:
    """Counts through the pipeline and pass rates, over the whole workspace, for `backend`."""
    con = ws.duckdb(["raw_modules", "tasks", "candidates", "verdicts"])
    one = lambda q: con.execute(q).fetchone()  # noqa: E731
    b = backend.replace("'", "")
    sourced = one("select count(*) from raw_modules")[0]
    tasks = one("select count(*) from tasks")[0]
    row = one(f"""
        select count(distinct c.candidate_id), count(v.candidate_id),
          count(*) filter (where v.status is not null and v.status not in
                           ('format_error','static_reject','compile_error')),
          count(*) filter (where v.status in ('correct_slow','correct_fast')),
          count(*) filter (where v.status = 'correct_fast'),
          count(distinct c.task_id) filter (where v.status in ('correct_slow','correct_fast')),
          median(v.speedup) filter (where v.status in ('correct_slow','correct_fast')),
          max(v.speedup) filter (where v.status in ('correct_slow','correct_fast')),
          count(*) filter (where c.turn = 0 and c.generator not like 'mutate:%'),
          count(*) filter (where c.turn = 0 and c.generator not like 'mutate:%'
                           and v.status in ('correct_slow','correct_fast')),
          count(*) filter (where c.turn > 0),
          count(*) filter (where c.turn > 0 and v.status in ('correct_slow','correct_fast'))
        from candidates c left join verdicts v using (candidate_id)
        where c.backend = '{b}'""")
    (cands, verified, compiled, correct, faster, solved, med, best, first, first_ok, rep,
     rep_ok) = row
    rate = lambda a, n: round(a / n, 4) if n else None  # noqa: E731
    return {
        "sourced_modules": sourced, "tasks": tasks, "candidates": cands, "verified": verified,
        "compiled": compiled, "correct": correct, "faster": faster, "tasks_solved": solved,
        "compile_rate": rate(compiled, verified), "pass_rate": rate(correct, verified),
        "first_attempt_pass_rate": rate(first_ok, first),
        "repair_pass_rate": rate(rep_ok, rep), "fast_rate": rate(faster, verified),
        "median_speedup": None if med is None else round(float(med), 3),
        "max_speedup": None if best is None else round(float(best), 3),
    }


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
    _say(f"build {run_id}: workspace {root}, backend {backend}, runner {cfg.flows.runner}")
    stage_rows: list[dict[str, Any]] = []

    def stage(name: str, fn: Any, runner_obj: Any, **kw: Any) -> dict[str, Any]:
        t0 = time.perf_counter()
        sub = fn.with_options(task_runner=runner_obj) if runner_obj is not None else fn
        counts = sub(root, run_id, cfg, stages=stages, **kw)
        row = {"stage": name, "seconds": round(time.perf_counter() - t0, 2), **counts}
        stage_rows.append(row)
        return counts

    with ray_session(cfg):
        stage("ingest", ingest_flow, io_runner(cfg))
        stage("tasks", tasks_flow, None)
        stage("generate", generate_flow, cpu_runner(cfg), backend=backend)
        stage("verify", verify_flow, verify_runner(cfg), backend=backend)
        if cfg.generate.mutations_per_kernel > 0:
            stage("mutate", mutate_flow, cpu_runner(cfg), backend=backend)
            stage("verify:mutants", verify_flow, verify_runner(cfg), backend=backend)
        for turn in range(1, cfg.repair.turns + 1):
            stage(f"repair:{turn}", repair_flow, cpu_runner(cfg), backend=backend, turn=turn)
            stage(f"verify:repair{turn}", verify_flow, verify_runner(cfg), backend=backend)
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
