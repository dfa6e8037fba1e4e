"""The generate stage: a batch of tasks -> first-attempt candidates from the configured generators.

`generate.generators` of the batch's config says which (templates, served or local LLMs, the
sample import); the plan hands the sample import one batch of every task, so the file is read
whole and each row it cannot use is a rejection naming the file and row. A generator that
crashes on a batch rejects the batch's tasks (`generator_error`); a network failure is raised,
so the executor may run the batch again, and so is a configuration that cannot work (unknown
generator, missing sample file, bad prompt template), so the step fails naming it. The OpenAI key is read here, at the stage's edge, from
the variable the config names, so no executor carries the secret.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from pipeline.candidates.generate import GenerateError, generate_candidates
from pipeline.candidates.import_samples import SampleFileError, import_candidates
from pipeline.config import GenerateConfig
from pipeline.prompts import PromptError
from pipeline.stage import (
    Stage,
    StageContext,
    StageOutput,
    is_transient,
    keep_rejections,
    reject,
)
from schemas import Candidate, Rejection, Task

GenerateFn = Callable[..., tuple[list[Candidate], list[Rejection]]]
# a bad generator name, sample file or prompt template: no batch can succeed
CONFIG_ERRORS = (GenerateError, SampleFileError, PromptError)


def first_attempts(tasks: list[Task], cfg: GenerateConfig, backend: str
                   ) -> tuple[list[Candidate], list[Rejection]]:
    """Candidates for `tasks` from every generator of `cfg` (the sample import: with a report)."""
    if cfg.generators == ["import"]:
        return import_candidates(tasks, cfg, backend, report=True)
    return generate_candidates(tasks, cfg, backend,
                               api_key=os.environ.get(cfg.openai_api_key_env) or None)


def generate_stage(fn: GenerateFn = first_attempts) -> Stage:
    """First attempts for a batch of tasks: `fn(tasks, GenerateConfig, backend)`."""

    def run(batch: list[Task], ctx: StageContext) -> StageOutput:
        out = StageOutput()
        try:
            made, rejected = fn(batch, ctx.cfg.generate, ctx.backend)
        except CONFIG_ERRORS:
            raise  # the configuration cannot work on any batch: the step fails, naming it
        except Exception as exc:
            if is_transient(exc):
                raise
            detail = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            for t in batch:
                reject(out, "generate", t.task_id, t.task_id, "generator_error", detail[:300])
            return out
        out.records = list(made)
        keep_rejections(out, list(rejected))
        return out

    return Stage("generate", Task, Candidate, run, retry_transient=True)


GENERATE = generate_stage()
