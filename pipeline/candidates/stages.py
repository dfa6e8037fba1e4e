"""The candidate stages as `Stage`s: generate (Task -> Candidate), mutate and repair (a batch of
whole tasks with their chains -> next Candidates). Each takes the pure function it wraps, so a flow
can run other implementations (tests' stand-ins) with the same shape.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from pipeline.candidates.generate import generate_candidates
from pipeline.candidates.mutate import mutate_candidates
from pipeline.candidates.repair import repair_round
from pipeline.stage import Stage, StageContext, StageOutput
from schemas import Candidate, Rejection, Task, Verdict

GenerateFn = Callable[..., tuple[list[Candidate], list[Rejection]]]
MutateFn = Callable[..., list[Candidate]]
RepairFn = Callable[..., tuple[list[Candidate], list[Rejection]]]


def _output(made: list[Candidate], rejected: list[Rejection]) -> StageOutput:
    counts: Counter[str] = Counter(candidates=len(made))
    counts.update(f"rejected:{r.reason}" for r in rejected)
    return StageOutput(list(made), list(rejected), counts)


def generate_stage(fn: GenerateFn = generate_candidates) -> Stage:
    """First attempts for a batch of tasks: `fn(tasks, GenerateConfig, backend)`."""

    def run(batch: list[Task], ctx: StageContext) -> StageOutput:
        return _output(*fn(batch, ctx.cfg.generate, ctx.backend))

    return Stage("generate", Task, Candidate, run)


def mutate_stage(fn: MutateFn = mutate_candidates) -> Stage:
    """Bug-injected variants of verified-correct kernels: `fn(tasks, candidates, verdicts, cfg)`."""

    def run(batch: list[Task], ctx: StageContext) -> StageOutput:
        return _output(fn(batch, ctx.candidates, ctx.verdicts, ctx.cfg.generate), [])

    return Stage("mutate", Task, Candidate, run)


def repair_turn(tasks: list[Task], candidates: list[Candidate], verdicts: list[Verdict],
                  cfg, turn: int) -> tuple[list[Candidate], list[Rejection]]:
    rejections: list[Rejection] = []
    made = repair_round(tasks, candidates, verdicts, cfg, turn, rejections=rejections)
    return made, rejections


def repair_stage(fn: RepairFn = repair_turn) -> Stage:
    """The next turn for every failing chain end: `fn(tasks, candidates, verdicts, cfg, turn)`."""

    def run(batch: list[Task], ctx: StageContext) -> StageOutput:
        return _output(*fn(batch, ctx.candidates, ctx.verdicts, ctx.cfg, ctx.turn))

    return Stage("repair", Task, Candidate, run)


GENERATE = generate_stage()
MUTATE = mutate_stage()
REPAIR = repair_stage()
