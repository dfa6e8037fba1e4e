"""The mutate stage: tasks with verified-correct kernels -> bug-injected candidates whose fix is
known (a failing first turn the repair stage answers with the original kernel)."""

from __future__ import annotations

from collections.abc import Callable

from pipeline.candidates.mutate import mutate_candidates
from pipeline.stage import Stage, StageContext, StageOutput
from schemas import Candidate, Task

MutateFn = Callable[..., list[Candidate]]


def mutate_stage(fn: MutateFn = mutate_candidates) -> Stage:
    """Bug-injected variants of verified-correct kernels: `fn(tasks, candidates, verdicts, cfg)`."""

    def run(batch: list[Task], ctx: StageContext) -> StageOutput:
        return StageOutput(list(fn(batch, ctx.candidates, ctx.verdicts, ctx.cfg.generate)))

    return Stage("mutate", Task, Candidate, run)


MUTATE = mutate_stage()
