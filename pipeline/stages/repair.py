"""The repair stage: a batch of whole tasks with their chains and verdicts -> the next turn for
every failing chain end (the known fix of a mutant, else the configured LLM with the verifier's
feedback). The OpenAI key is read here, at the stage's edge, from the variable the config names.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from pipeline.candidates.repair import repair_round
from pipeline.config import Config
from pipeline.stage import Stage, StageContext, StageOutput, keep_rejections
from schemas import Candidate, Rejection, Task, Verdict

RepairFn = Callable[..., tuple[list[Candidate], list[Rejection]]]


def repair_turn(tasks: list[Task], candidates: list[Candidate], verdicts: list[Verdict],
                cfg: Config, turn: int) -> tuple[list[Candidate], list[Rejection]]:
    """Turn `turn` of every failing chain end of `tasks`, and the rejections (LLM errors)."""
    rejections: list[Rejection] = []
    made = repair_round(tasks, candidates, verdicts, cfg, turn, rejections=rejections,
                        api_key=os.environ.get(cfg.generate.openai_api_key_env) or None)
    return made, rejections


def repair_stage(fn: RepairFn = repair_turn) -> Stage:
    """The next turn for every failing chain end: `fn(tasks, candidates, verdicts, cfg, turn)`."""

    def run(batch: list[Task], ctx: StageContext) -> StageOutput:
        made, rejected = fn(batch, ctx.candidates, ctx.verdicts, ctx.cfg, ctx.turn)
        out = StageOutput(list(made))
        keep_rejections(out, list(rejected))
        return out

    return Stage("repair", Task, Candidate, run, retry_transient=True)


REPAIR = repair_stage()
