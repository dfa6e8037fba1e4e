"""The compile stage: a compile-only pass over a batch of candidates (GPU backends on Ray) that
fills the shared build cache before the verify stage runs them, so GPUs never wait on nvcc."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from pipeline.config import Config
from pipeline.stage import Resources, Stage, StageContext, StageOutput
from pipeline.stages.verify import VerifyFn, verify_with_rejections
from schemas import Candidate, Verdict


def _compile_needs(cfg: Config, backend: str) -> Resources:
    return Resources(cpus=max(1, min(cfg.verify.compile_workers, cfg.flows.ray_num_cpus or 10**6)),
                     subprocesses=True)  # compilers


def compile_stage(fn: VerifyFn = verify_with_rejections) -> Stage:
    """A compile-only pass (GPU backends on Ray) that fills the build cache; writes nothing."""

    def run(batch: list[Candidate], ctx: StageContext) -> StageOutput:
        vcfg = ctx.cfg.verify.model_copy(update={"compile_only": True})
        verdicts, _ = fn(ctx.tasks, batch, vcfg, Path(ctx.cache_dir))
        return StageOutput(counts=Counter(compiled=len(verdicts)))

    return Stage("compile", Candidate, Verdict, run, needs=_compile_needs)


COMPILE = compile_stage()
