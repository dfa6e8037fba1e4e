"""The generate stage: candidate kernels for tasks from templates, served LLMs or local models.

`generate_candidates` is the pure stage function (tasks in, candidates and rejections out); the
generate Stage (`pipeline/stages/generate.py`) wraps it and the plan (`pipeline/plan.py`) decides
which tasks are pending. `mutate` needs verdicts, so it is a step of its own.
"""

from __future__ import annotations

import json

from pipeline.candidates.import_samples import import_candidates
from pipeline.candidates.llm import ChatBackend, LLMError, make_backend
from pipeline.candidates.response_code import extract_code
from pipeline.config import GenerateConfig
from pipeline.prompts import build_prompt, fence
from schemas import Candidate, Rejection, Task

GENERATORS = ("template", "openai", "hf", "import", "mutate")


class GenerateError(ValueError):
    """The generate configuration cannot work (unknown generator, no model); names the field."""


def resolve_backend(requested: str) -> str:
    """`auto` -> the verifier's choice for this machine (cuda, musa or cpu); others unchanged."""
    if requested != "auto":
        return requested
    try:
        from verifier.backends import select_backend
    except ImportError:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return select_backend("auto")


def _ref(task: Task) -> str:
    return task.path or task.name or task.task_id


def _prefetch_traces(tasks: list[Task], backend: str) -> None:
    """Trace the batch's references in one sandboxed child (one torch import, not one per task).

    A failed batch trace is not an error: each task is then traced on its own, so one bad
    reference only costs its own task.
    """
    from pipeline.candidates.templates import NoTemplate
    from pipeline.candidates.templates.analysis import trace_sources

    sources = [t.cpu_source if backend == "cpu" else t.source for t in tasks]
    if len(sources) < 2:
        return
    try:
        trace_sources(sources, timeout_s=60.0 + 5.0 * len(sources))
    except NoTemplate:
        return


def template_stage(tasks: list[Task], cfg: GenerateConfig, backend: str
                   ) -> tuple[list[Candidate], list[Rejection]]:
    """The built-in teacher: template kernels; uncovered tasks become `no_template` rejections."""
    try:
        from pipeline.candidates.templates import NoTemplate, template_candidates
    except ImportError as exc:
        return [], [Rejection.make("generate", t.task_id, _ref(t), "generator_unavailable",
                                   f"pipeline.candidates.templates cannot be imported: {exc}")
                    for t in tasks]
    out: list[Candidate] = []
    rejected: list[Rejection] = []
    _prefetch_traces(tasks, backend)
    for task in tasks:
        try:
            made = template_candidates(task, backend, cfg.variants_per_task)
        except NoTemplate as exc:
            rejected.append(Rejection.make("generate", task.task_id, _ref(task), "no_template",
                                           f"{_ref(task)}: {exc}"))
            continue
        except Exception as exc:  # noqa: BLE001 - one task's template bug must not end the run
            rejected.append(Rejection.make("generate", task.task_id, _ref(task), "template_error",
                                           f"{_ref(task)}: {type(exc).__name__}: {exc}"))
            continue
        prompt = build_prompt(task, backend, cfg)
        for cand in made:
            if not cand.prompt:
                cand.prompt = list(prompt)
            if not cand.raw_response:
                reasoning = cand.meta_dict().get("reasoning", "") if cfg.include_reasoning else ""
                cand.raw_response = fence(cand.code, reasoning)
            out.append(cand)
    return out, rejected


def llm_stage(tasks: list[Task], cfg: GenerateConfig, backend: str, llm: ChatBackend
              ) -> tuple[list[Candidate], list[Rejection]]:
    """`cfg.samples` answers per task from `llm`; unusable answers still become candidates."""
    prompts = [build_prompt(t, backend, cfg) for t in tasks]
    answers = llm.chat(prompts, n=cfg.samples)
    out: list[Candidate] = []
    rejected: list[Rejection] = []
    for task, prompt, answer in zip(tasks, prompts, answers, strict=True):
        if isinstance(answer, LLMError):
            rejected.append(Rejection.make("generate", task.task_id, _ref(task), "llm_error",
                                           f"{llm.generator_name}: {answer}"))
            continue
        for j, completion in enumerate(answer):
            # an answer without code is kept: the verifier scores it format_error, which is
            # itself training signal (and counts in the group's pass rate)
            code = extract_code(completion.text) or ""
            meta = {"model": llm.generator_name, "sample": j, "usage": completion.usage(),
                    "temperature": cfg.temperature, "top_p": cfg.top_p}
            if completion.extra.get("reasoning_content"):
                meta["reasoning"] = completion.extra["reasoning_content"]
            out.append(Candidate(
                candidate_id=Candidate.make_id(task.task_id, backend, code or completion.text),
                task_id=task.task_id, backend=backend, generator=llm.generator_name, code=code,
                raw_response=completion.text, prompt=prompt, meta=json.dumps(meta)))
    return out, rejected


def generate_candidates(
    tasks: list[Task],
    cfg: GenerateConfig,
    backend: str,
    *,
    llm: ChatBackend | None = None,
    api_key: str | None = None,
) -> tuple[list[Candidate], list[Rejection]]:
    """Candidates for `tasks` on `backend` from every generator in `cfg.generators`."""
    unknown = [g for g in cfg.generators if g not in GENERATORS]
    if unknown:
        raise GenerateError(f"generate.generators: unknown {unknown} (known: {GENERATORS})")
    backend = resolve_backend(backend)
    candidates: list[Candidate] = []
    rejections: list[Rejection] = []
    for gen in cfg.generators:
        if gen == "template":
            made, rejected = template_stage(tasks, cfg, backend)
        elif gen in ("openai", "hf"):
            if not tasks:
                continue
            try:
                chat = llm or make_backend(gen, cfg, api_key)
            except LLMError as exc:
                rejections.extend(Rejection.make("generate", t.task_id, _ref(t),
                                                 "llm_unavailable", str(exc)) for t in tasks)
                continue
            made, rejected = llm_stage(tasks, cfg, backend, chat)
        elif gen == "import":
            # a batch sees only its tasks: rows for other tasks are not errors here
            # (the plan's generate step imports the whole file and reports every unusable row)
            made = import_candidates(tasks, cfg, backend, report=False)[0]
            rejected = []
        else:  # mutate works from verdicts: the plan's mutate step
            continue
        candidates.extend(made)
        rejections.extend(rejected)
    unique = {c.candidate_id: c for c in candidates}  # the first of identical kernels wins
    return list(unique.values()), rejections
