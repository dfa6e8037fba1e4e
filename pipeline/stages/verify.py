"""The verify stage: candidates and their tasks in, verdicts out (a client of `verifier.api`).

For the cpu backend the reference is `Task.cpu_source` (dims scaled down), for GPU backends
`Task.source`. The plan (`pipeline.plan`) hands it the candidates that have no verdict yet, in
batches of `verify.write_batch`, so a crash loses at most the batch in flight.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

from pipeline.config import Config, VerifyConfig
from pipeline.datasets.retime import retime_borderline
from pipeline.stage import (
    GPU_BACKENDS,
    Resources,
    Stage,
    StageContext,
    StageOutput,
    keep_rejections,
)
from pipeline.tasks.probe.variants import task_variants
from schemas import Candidate, Rejection, Task, Verdict
from verifier.api import verify_batch
from verifier.backends import BackendUnavailable, select_backend
from verifier.isolation.sandbox import EnvironmentFailure, common_failure
from verifier.protocol import VerdictData, VerifyOptions, VerifyRequest


def verify_options(cfg: VerifyConfig, cache_dir: Path) -> VerifyOptions:
    """The verifier's options from the pipeline config; caches default under `cache_dir`."""
    opts = VerifyOptions.from_mapping(cfg.model_dump())
    opts.build_cache_dir = cfg.build_cache_dir or str(cache_dir / "builds")
    opts.baseline_cache_dir = cfg.baseline_cache_dir or str(cache_dir / "baselines")
    return opts


def missing_task(c: Candidate) -> Rejection:
    """The rejection of a candidate whose task is not in the workspace (never verified)."""
    return Rejection.make("verify", c.candidate_id, f"task {c.task_id}", "missing_task",
                          f"candidate {c.candidate_id}: task {c.task_id} is not in the workspace")


def _reference(task: Task, backend: str) -> str:
    return (task.cpu_source or task.source) if backend == "cpu" else task.source


def verify_with_rejections(
    tasks: dict[str, Task], candidates: list[Candidate], cfg: VerifyConfig, cache_dir: Path,
    progress: Callable[[VerdictData], None] | None = None,
) -> tuple[list[Verdict], list[Rejection]]:
    """Verdicts for the candidates that can be verified here; rejections (with reasons) else."""
    rejections: list[Rejection] = []
    groups: dict[str, list[VerifyRequest]] = {}
    for c in candidates:
        task = tasks.get(c.task_id)
        if task is None:
            rejections.append(missing_task(c))
            continue
        requested = cfg.backend if cfg.backend != "auto" else (c.backend or "auto")
        try:
            backend = select_backend(requested)
        except BackendUnavailable as exc:
            rejections.append(Rejection.make("verify", c.candidate_id, f"backend {requested}",
                                             "backend_unavailable", str(exc)))
            continue
        source = _reference(task, backend)
        groups.setdefault(backend, []).append(VerifyRequest(
            c.candidate_id, c.task_id, source, c.code or c.raw_response,
            backend, task_variants(task, backend) if cfg.generalize else None,
            # the physics floor's FLOPs: the task's estimate is for its own sizes only
            flops=task.flops if source == task.source else 0.0))
    verdicts: list[Verdict] = []
    opts = verify_options(cfg, cache_dir)
    for backend, reqs in groups.items():
        opts.backend = backend
        batch = verify_batch(reqs, opts, progress)
        # the sandbox or interpreter failing every candidate alike is no verdict on them
        same = common_failure([v.error if v.status == "runtime_error" else "" for v in batch])
        if same:
            raise EnvironmentFailure(f"every one of {len(batch)} candidates ({backend}) failed "
                                     f"the same way, so the environment is broken, not the "
                                     f"candidates: {same}")
        verdicts += [Verdict.from_dict(v.to_dict()) for v in batch]
    return verdicts, rejections


def verify_candidates(tasks: dict[str, Task], candidates: list[Candidate], cfg: VerifyConfig,
                      cache_dir: Path) -> list[Verdict]:
    """One verdict per candidate whose task is known and whose backend can run here."""
    return verify_with_rejections(tasks, candidates, cfg, cache_dir)[0]


VerifyFn = Callable[..., tuple[list[Verdict], list[Rejection]]]


def _verify_needs(cfg: Config, backend: str) -> Resources:
    # GPU backends: one GPU per batch (the verifier pins its worker to it); CPU: its workers.
    # Either way the candidates run in sandboxed worker processes the verifier starts.
    if backend in GPU_BACKENDS:
        return Resources(cpus=1, gpus=1, subprocesses=True)
    return Resources(cpus=max(1, min(cfg.verify.workers, cfg.flows.ray_num_cpus or 10**6)),
                     subprocesses=True)


def verify_stage(fn: VerifyFn = verify_with_rejections) -> Stage:
    """Candidates -> Verdicts through `fn` (default: the verifier); rejections for the rest."""

    def run(batch: list[Candidate], ctx: StageContext) -> StageOutput:
        verdicts, rejections = fn(ctx.tasks, batch, ctx.cfg.verify, Path(ctx.cache_dir),
                                  *([ctx.progress] if ctx.progress else []))
        sel = ctx.cfg.select
        # a teacher kernel near the speed gate is timed again before any label rests on it
        verdicts, retimed = retime_borderline(
            list(verdicts), batch, lambda cs: fn(ctx.tasks, cs, ctx.cfg.verify,
                                                 Path(ctx.cache_dir))[0],
            sel.min_speedup, sel.retime_below)
        out = StageOutput(list(verdicts), counts=Counter(verified=len(verdicts)))
        if retimed:
            out.counts["retimed"] = retimed
        out.counts.update(v.status for v in verdicts)
        keep_rejections(out, list(rejections))
        return out

    return Stage("verify", Candidate, Verdict, run, needs=_verify_needs,
                 batch_size=lambda cfg: cfg.verify.write_batch)


VERIFY = verify_stage()
